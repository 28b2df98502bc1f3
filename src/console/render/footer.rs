//! Footer: the focused pane's keys (from the key map), then the flash line
//! (last action's result), the drain progress, or filter/marks in effect.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::View;
use crate::console::keymap::{self, Context};

pub fn draw(frame: &mut Frame, area: Rect, v: &View) {
    let t = v.theme;
    let [hints_area, flash_area] = Layout::vertical([Constraint::Length(1); 2]).areas(area);
    let ctx = Context {
        pane: v.app.focus,
        detail: v.app.detail.is_some(),
    };
    let mut spans = Vec::new();
    if v.app.detail.is_some() {
        spans.extend([Span::styled("Esc", t.key()), Span::raw(" back  ")]);
    }
    for (key, what) in keymap::hints(ctx, v.app.mode()) {
        spans.push(Span::styled(key, t.key()));
        spans.push(Span::raw(format!(" {what}  ")));
    }
    if v.app.readonly {
        spans.push(Span::styled("read-only", t.warn()));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), hints_area);

    let line = if let Some(left) = v.drain_left.filter(|_| v.app.draining) {
        let running = v.engine.map_or(0, |e| e.running.len());
        Line::styled(
            format!(
                "draining: {running} running job(s) get {:.0}s more, then are stopped (Q: stop now)",
                left.as_secs_f64().ceil()
            ),
            t.warn().add_modifier(Modifier::BOLD),
        )
    } else if v.app.draining {
        Line::styled("draining: stopping…", t.warn().add_modifier(Modifier::BOLD))
    } else if let Some(f) = &v.app.flash {
        Line::styled(f.text.clone(), if f.error { t.bad() } else { t.good() })
    } else {
        let mut parts = Vec::new();
        if !v.app.filter.is_empty() {
            parts.push(format!("filter: {} (Esc clears)", v.app.filter));
        }
        if !v.app.marked.is_empty() {
            parts.push(format!("{} marked", v.app.marked.len()));
        }
        Line::styled(parts.join(" · "), t.dim())
    };
    frame.render_widget(Paragraph::new(line), flash_area);
}
