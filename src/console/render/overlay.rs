//! Popups drawn over everything: help (generated from the key map), the
//! y/n confirmation, and the small text forms.

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::View;
use crate::console::dialogs::{Input, Overlay};
use crate::console::keymap::{self, Scope};

pub fn draw(frame: &mut Frame, area: Rect, v: &View) {
    match &v.app.overlay {
        None => {}
        Some(Overlay::Help) => help(frame, area, v),
        Some(Overlay::Confirm(c)) => {
            let t = v.theme;
            let lines = vec![
                Line::raw(c.question.clone()),
                Line::raw(""),
                Line::from(vec![
                    Span::styled("y", t.key()),
                    Span::raw(" yes   "),
                    Span::styled("n", t.key()),
                    Span::raw(" no"),
                ]),
            ];
            popup(frame, area, " Confirm ", lines, 60, v);
        }
        Some(Overlay::Input(i)) => input(frame, area, i, v),
    }
}

fn popup(frame: &mut Frame, area: Rect, title: &str, lines: Vec<Line>, width: u16, v: &View) {
    let width = width.min(area.width);
    // Borders plus the lines, wrapped lines included (roughly).
    let inner = width.saturating_sub(2).max(1) as usize;
    let needed: usize = lines.iter().map(|l| l.width().max(1).div_ceil(inner)).sum();
    let height = (needed as u16 + 2).min(area.height);
    let [row] = Layout::vertical([Constraint::Length(height)])
        .flex(Flex::Center)
        .areas(area);
    let [rect] = Layout::horizontal([Constraint::Length(width)])
        .flex(Flex::Center)
        .areas(row);
    frame.render_widget(Clear, rect);
    let block = Block::new()
        .borders(Borders::ALL)
        .border_style(v.theme.border(true))
        .title(Span::styled(title.to_string(), v.theme.title(true)));
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        rect,
    );
}

fn help(frame: &mut Frame, area: Rect, v: &View) {
    let t = v.theme;
    let mut lines = Vec::new();
    for scope in [
        Scope::Global,
        Scope::Panes,
        Scope::Rows,
        Scope::Jobs,
        Scope::Locks,
        Scope::Schedules,
    ] {
        // A scope may have no key of its own, or only mutating ones that
        // `--readonly` leaves unbound: no header without keys under it.
        let keys: Vec<_> = keymap::active(v.app.mode())
            .filter(|b| b.scope == scope)
            .collect();
        if keys.is_empty() {
            continue;
        }
        lines.push(Line::styled(format!("{}:", scope.title()), t.title(false)));
        for b in keys {
            lines.push(Line::from(vec![
                Span::styled(format!("  {:<7}", b.label), t.key()),
                Span::raw(v.app.mode().description(b)),
            ]));
        }
    }
    lines.push(Line::from(vec![
        Span::styled("  mouse  ", t.key()),
        Span::raw("click focuses a pane and selects a row; wheel scrolls"),
    ]));
    if v.app.readonly {
        lines.push(Line::styled(
            "read-only: keys that change anything are not bound",
            t.warn(),
        ));
    }
    if !v.app.engine {
        lines.push(Line::styled(
            "no workers here: keys that act on this node's engine are not bound",
            t.warn(),
        ));
    }
    lines.push(Line::styled("any key closes this help", t.dim()));
    popup(frame, area, " Keys ", lines, 76, v);
}

fn input(frame: &mut Frame, area: Rect, i: &Input, v: &View) {
    let t = v.theme;
    let mut lines: Vec<Line> = i
        .fields
        .iter()
        .enumerate()
        .map(|(n, f)| {
            let cursor = if n == i.focus { "▏" } else { "" };
            Line::from(vec![
                Span::styled(format!("{:>10}: ", f.label), t.dim()),
                Span::raw(format!("{}{cursor}", f.value)),
            ])
        })
        .collect();
    if let Some(e) = &i.error {
        lines.push(Line::styled(e.clone(), t.bad()));
    }
    lines.push(Line::styled(
        if i.fields.len() > 1 {
            "Enter ok · Tab next field · Esc cancel"
        } else {
            "Enter ok · Esc cancel"
        },
        t.dim(),
    ));
    popup(frame, area, &format!(" {} ", i.title()), lines, 64, v);
}
