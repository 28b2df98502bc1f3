//! Rows of the cluster panes: Locks, Workers, Schedules.

use ratatui::layout::Constraint::{Fill, Length};
use ratatui::text::Span;
use ratatui::widgets::{Cell, Row};

use super::Grid;
use crate::console::fmt::{ago, short_duration};
use crate::console::render::View;
use crate::job::State;

pub fn locks<'a>(v: &View) -> Grid<'a> {
    let t = v.theme;
    let rows = v
        .snap
        .locks
        .iter()
        .map(|l| {
            let row = Row::new([
                Cell::from(l.target.clone()),
                Cell::from(format!("#{}", l.job_id)),
                Cell::from(Span::styled(l.job_state.to_string(), t.state(l.job_state))),
                Cell::from(l.worker_id.clone().unwrap_or_else(|| "-".into())),
                Cell::from(l.fence.to_string()),
                Cell::from(short_duration(v.now - l.acquired_at)),
                Cell::from(l.waiting.to_string()),
            ]);
            // A stale holder means the target is quarantined: the whole row
            // is the alarm.
            if l.job_state == State::Stale {
                row.style(t.bad())
            } else {
                row
            }
        })
        .collect();
    Grid {
        header: &[
            "TARGET", "HOLDER", "STATE", "WORKER", "FENCE", "HELD", "WAIT",
        ],
        widths: vec![
            Length(14),
            Length(7),
            Length(8),
            Fill(1),
            Length(5),
            Length(7),
            Length(4),
        ],
        rows,
    }
}

pub fn workers<'a>(v: &View) -> Grid<'a> {
    let t = v.theme;
    let rows = v
        .snap
        .workers
        .iter()
        .map(|w| {
            let status = if w.gone {
                "gone"
            } else if w.paused {
                "paused"
            } else {
                "alive"
            };
            let row = Row::new([
                Cell::from(w.id.clone()),
                Cell::from(w.host.clone()),
                Cell::from(w.pid.to_string()),
                Cell::from(format!("{}/{}", w.busy, w.slots)),
                Cell::from(ago(w.heartbeat_at, v.now)),
                Cell::from(status),
            ]);
            if w.gone { row.style(t.bad()) } else { row }
        })
        .collect();
    Grid {
        header: &["ID", "HOST", "PID", "BUSY", "HEARTBEAT", "STATUS"],
        widths: vec![
            Fill(1),
            Length(10),
            Length(7),
            Length(5),
            Length(9),
            Length(6),
        ],
        rows,
    }
}

pub fn schedules<'a>(v: &View) -> Grid<'a> {
    let t = v.theme;
    let rows = v
        .snap
        .schedules
        .iter()
        .map(|s| {
            let next = match s.next_fire_at {
                Some(n) if s.paused => format!("({})", ago(n, v.now)),
                Some(n) => ago(n, v.now),
                None => "-".into(),
            };
            Row::new([
                Cell::from(s.def.name.clone()),
                Cell::from(s.def.cron.clone()),
                Cell::from(next),
                Cell::from(s.last_job_id.map_or("-".into(), |j| format!("#{j}"))),
                Cell::from(s.last_skip_at.map_or("-".into(), |k| ago(k, v.now))),
                Cell::from(if s.paused {
                    Span::styled("paused", t.warn())
                } else {
                    Span::raw("")
                }),
            ])
        })
        .collect();
    Grid {
        header: &["NAME", "CRON", "NEXT", "LAST", "SKIPPED", ""],
        widths: vec![
            Fill(1),
            Length(14),
            Length(9),
            Length(6),
            Length(9),
            Length(6),
        ],
        rows,
    }
}
