//! Rows of the job panes: Queued, Leased, Running, Stale, Finished.

use chrono::TimeDelta;
use ratatui::layout::Constraint::{Fill, Length};
use ratatui::text::Span;
use ratatui::widgets::{Cell, Row};

use super::Grid;
use crate::console::fmt::{LEFT_WIDTH, ago, clip, left, short_duration};
use crate::console::render::View;
use crate::console::snapshot::why::{Wait, why_waiting};
use crate::job::{Job, State};

fn id_cell<'a>(job: &Job, v: &View) -> Cell<'a> {
    if v.app.marked.contains(&job.id) {
        Cell::from(Span::styled(format!("*{}", job.id), v.theme.marked()))
    } else {
        Cell::from(job.id.to_string())
    }
}

fn target(job: &Job) -> String {
    job.target.clone().unwrap_or_else(|| "-".into())
}

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_else(|| "-".into())
}

pub fn queued<'a>(v: &View) -> Grid<'a> {
    let t = v.theme;
    let rows = v
        .snap
        .queued
        .iter()
        .map(|j| {
            let due = j.due_at - v.now;
            let due = if due > TimeDelta::zero() {
                short_duration(due)
            } else {
                "now".into()
            };
            let wait = why_waiting(j, v.snap, v.now);
            let style = match wait {
                Wait::BlockedBy(_) | Wait::NoWorker(_) => t.warn(),
                Wait::Retry(_) => t.bad(),
                Wait::Due(_) | Wait::Ready => t.dim(),
            };
            Row::new([
                id_cell(j, v),
                Cell::from(j.pipeline.clone()),
                Cell::from(target(j)),
                Cell::from(j.priority.to_string()),
                Cell::from(due),
                Cell::from(Span::styled(wait.to_string(), style)),
            ])
        })
        .collect();
    Grid {
        header: &[
            "ID",
            "PIPELINE",
            "TARGET",
            "PRI",
            "DUE IN",
            "WAITING BECAUSE",
        ],
        widths: vec![
            Length(7),
            Length(12),
            Length(16),
            Length(4),
            Length(7),
            Fill(1),
        ],
        rows,
    }
}

/// Lease left, yellow under a third of the pipeline's lease, red once out.
fn lease_cell<'a>(job: &Job, v: &View) -> Cell<'a> {
    let Some(exp) = job.lease_expires_at else {
        return Cell::from("-");
    };
    let rest = exp - v.now;
    let lease = TimeDelta::from_std(v.catalog.lease(&job.pipeline)).unwrap_or(TimeDelta::MAX);
    let style = if rest <= TimeDelta::zero() {
        v.theme.bad()
    } else if rest * 3 < lease {
        v.theme.warn()
    } else {
        ratatui::style::Style::new()
    };
    Cell::from(Span::styled(left(exp, v.now), style))
}

pub fn leased<'a>(v: &View) -> Grid<'a> {
    let rows = v
        .snap
        .leased
        .iter()
        .map(|j| {
            Row::new([
                id_cell(j, v),
                Cell::from(j.pipeline.clone()),
                Cell::from(target(j)),
                Cell::from(opt(&j.lease_owner)),
                lease_cell(j, v),
            ])
        })
        .collect();
    Grid {
        header: &["ID", "PIPELINE", "TARGET", "OWNER", "LEASE LEFT"],
        widths: vec![
            Length(7),
            Length(12),
            Length(16),
            Fill(1),
            Length(LEFT_WIDTH),
        ],
        rows,
    }
}

/// "2/4 verify", from this node's live status when it runs the job (it
/// knows the step being run right now), else from the configuration.
fn step_label(j: &Job, v: &View) -> String {
    let own = v
        .engine
        .and_then(|e| e.running.iter().find(|s| s.job_id == j.id));
    match own {
        Some(s) => format!("{}/{} {}", s.step + 1, s.steps_total, s.step_name),
        None => v.catalog.step_label(&j.pipeline, j.step),
    }
}

pub fn running<'a>(v: &View) -> Grid<'a> {
    let rows = v
        .snap
        .running
        .iter()
        .map(|j| {
            let mut step = step_label(j, v);
            if j.cancel_requested_at.is_some() {
                step.push_str(" (cancelling)");
            }
            Row::new([
                id_cell(j, v),
                Cell::from(j.pipeline.clone()),
                Cell::from(target(j)),
                Cell::from(step),
                Cell::from(opt(&j.lease_owner)),
                Cell::from(j.lock_fence.map_or("-".into(), |f| f.to_string())),
                Cell::from(
                    j.started_at
                        .map_or("-".into(), |s| short_duration(v.now - s)),
                ),
                lease_cell(j, v),
            ])
        })
        .collect();
    Grid {
        header: &[
            "ID",
            "PIPELINE",
            "TARGET",
            "STEP",
            "WORKER",
            "FENCE",
            "RUNNING",
            "LEASE LEFT",
        ],
        widths: vec![
            Length(7),
            Length(12),
            Length(16),
            Length(18),
            Fill(1),
            Length(5),
            Length(8),
            Length(LEFT_WIDTH),
        ],
        rows,
    }
}

pub fn stale<'a>(v: &View) -> Grid<'a> {
    let t = v.theme;
    let rows = v
        .snap
        .stale
        .iter()
        .map(|j| {
            let holds = j
                .target
                .as_deref()
                .and_then(|tg| v.snap.lock_of(tg))
                .is_some_and(|l| l.job_id == j.id);
            let lock = if holds {
                Span::styled(
                    format!("held, fence {}", j.lock_fence.unwrap_or_default()),
                    t.bad(),
                )
            } else {
                Span::styled("released", t.dim())
            };
            let last_step = v.catalog.step_name(&j.pipeline, j.step).map_or_else(
                || format!("step {}", j.step + 1),
                |n| format!("{} {n}", j.step + 1),
            );
            Row::new([
                id_cell(j, v),
                Cell::from(j.pipeline.clone()),
                Cell::from(target(j)),
                Cell::from(opt(&j.lease_owner)),
                Cell::from(Span::styled(
                    j.lease_expires_at.map_or("-".into(), |e| ago(e, v.now)),
                    t.bad(),
                )),
                Cell::from(last_step),
                Cell::from(lock),
            ])
        })
        .collect();
    Grid {
        header: &[
            "ID",
            "PIPELINE",
            "TARGET",
            "LAST WORKER",
            "EXPIRED",
            "LAST STEP",
            "LOCK",
        ],
        widths: vec![
            Length(7),
            Length(12),
            Length(16),
            Fill(1),
            Length(10),
            Length(14),
            Length(16),
        ],
        rows,
    }
}

pub fn finished<'a>(v: &View) -> Grid<'a> {
    let t = v.theme;
    let rows = v
        .snap
        .finished
        .iter()
        .map(|j| {
            let took = match (j.started_at, j.finished_at) {
                (Some(s), Some(f)) => short_duration(f - s),
                _ => "-".into(),
            };
            let err = j
                .last_error
                .as_deref()
                .map(|e| clip(e, 200))
                .unwrap_or_default();
            let err_style = if j.state == State::Succeeded {
                t.dim()
            } else {
                t.bad()
            };
            Row::new([
                id_cell(j, v),
                Cell::from(j.pipeline.clone()),
                Cell::from(target(j)),
                Cell::from(Span::styled(j.state.to_string(), t.state(j.state))),
                Cell::from(took),
                Cell::from(j.finished_at.map_or("-".into(), |f| ago(f, v.now))),
                Cell::from(Span::styled(err, err_style)),
            ])
        })
        .collect();
    Grid {
        header: &[
            "ID",
            "PIPELINE",
            "TARGET",
            "STATE",
            "TOOK",
            "FINISHED",
            "LAST ERROR",
        ],
        widths: vec![
            Length(7),
            Length(12),
            Length(14),
            Length(9),
            Length(6),
            Length(8),
            Fill(1),
        ],
        rows,
    }
}
