//! Two header lines: who and where (database, node, slots, clock), then the
//! cluster's totals per state and the throughput sparkline, or the
//! database error when the last fetch failed.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline};

use super::View;
use crate::console::snapshot::fetch::HIST_BUCKET;
use crate::job::State;

pub fn draw(frame: &mut Frame, area: Rect, v: &View) {
    let t = v.theme;
    let [top, bottom] = Layout::vertical([Constraint::Length(1); 2]).areas(area);
    let clock = v.now.format("%H:%M:%S UTC").to_string();
    let [left, right] = Layout::horizontal([
        Constraint::Fill(1),
        Constraint::Length(clock.len() as u16 + 1),
    ])
    .areas(top);

    let mut spans = vec![
        Span::styled("jobdeck", t.title(false)),
        Span::raw(" │ "),
        Span::raw(v.db.to_string()),
        Span::raw(" │ node "),
        Span::raw(v.node_id.to_string()),
        Span::raw(" │ "),
    ];
    match v.engine {
        Some(e) => {
            spans.push(Span::raw(format!("slots {}/{}", e.busy(), e.slots)));
            spans.push(Span::raw(" "));
            if v.drain_left.is_some() || e.draining_until.is_some() {
                spans.push(Span::styled(
                    "draining",
                    t.warn().add_modifier(Modifier::BOLD),
                ));
            } else if e.paused {
                spans.push(Span::styled(
                    "paused",
                    t.warn().add_modifier(Modifier::BOLD),
                ));
            } else {
                spans.push(Span::styled("claiming", t.good()));
            }
        }
        None => spans.push(Span::styled("no workers (watching)", t.dim())),
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), left);
    frame.render_widget(Paragraph::new(clock).right_aligned(), right);

    if let Some(err) = &v.snap.error {
        let line = Line::from(Span::styled(
            err.clone(),
            t.bad().add_modifier(Modifier::BOLD),
        ));
        frame.render_widget(Paragraph::new(line), bottom);
        return;
    }
    let mut spans = Vec::new();
    for s in State::ALL {
        if s == State::Succeeded {
            spans.push(Span::raw("│ "));
        }
        spans.push(Span::styled(format!("{s} "), t.state(s)));
        spans.push(Span::raw(format!("{}  ", v.snap.count(s))));
    }
    let label = format!("│ finished/{}s ", HIST_BUCKET.as_secs());
    spans.push(Span::raw(label));
    let counts = Line::from(spans);
    let used = counts.width() as u16;
    let [counts_area, spark_area] =
        Layout::horizontal([Constraint::Length(used), Constraint::Fill(1)]).areas(bottom);
    frame.render_widget(Paragraph::new(counts), counts_area);
    let hist = &v.snap.histogram;
    // Newest buckets on the right: drop the oldest ones that do not fit.
    let shown = &hist[hist.len().saturating_sub(spark_area.width as usize)..];
    frame.render_widget(Sparkline::default().data(shown).style(t.good()), spark_area);
}
