//! The detail view: every field of one job, its lock and fence, step
//! progress, event history and the tail of its output.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Borders, Cell, Paragraph, Row, Scrollbar, ScrollbarOrientation, ScrollbarState, Table,
    TableState,
};

use super::View;
use super::panes::scroll;
use crate::console::fmt::{ago, left, short_duration};
use crate::job::Job;

pub fn draw(frame: &mut Frame, area: Rect, v: &View) {
    let t = v.theme;
    let Some(id) = v.app.detail else { return };
    let Some(d) = v.snap.detail.as_ref().filter(|d| d.job.id == id) else {
        let msg = Paragraph::new(format!("loading job {id}…")).block(block(" Job ", v));
        frame.render_widget(msg, area);
        return;
    };
    let [fields, right] =
        Layout::horizontal([Constraint::Length(48), Constraint::Fill(1)]).areas(area);
    let [events, output] =
        Layout::vertical([Constraint::Fill(1), Constraint::Fill(1)]).areas(right);

    frame.render_widget(
        Paragraph::new(field_lines(&d.job, v)).block(block(&format!(" Job {id} "), v)),
        fields,
    );

    let rows = d.events.iter().map(|e| {
        let from = e.from.map_or("-".to_string(), |s| s.to_string());
        Row::new([
            Cell::from(e.at.format("%H:%M:%S").to_string()),
            Cell::from(Line::from(vec![
                Span::raw(format!("{from}→")),
                Span::styled(e.to.to_string(), t.state(e.to)),
            ])),
            Cell::from(e.actor.clone()),
            Cell::from(e.detail.clone()),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Length(18),
            Constraint::Length(22),
            Constraint::Fill(1),
        ],
    )
    .header(
        Row::new(["AT", "MOVE", "ACTOR", "DETAIL"])
            .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)),
    )
    .block(block(" Events ", v))
    .row_highlight_style(t.selected());
    // Below the title and the column header.
    let list = Rect {
        y: events.y.saturating_add(2),
        height: events.height.saturating_sub(2),
        ..events
    };
    let len = d.events.len();
    let visible = list.height as usize;
    let selected = v.app.selected_event(len);
    let offset = scroll(v.app.detail_offset.get(), selected, visible, len);
    v.app.detail_offset.set(offset);
    let mut state = TableState::default()
        .with_offset(offset)
        .with_selected(selected);
    frame.render_stateful_widget(table, events, &mut state);
    if len > visible {
        // One position per first visible event.
        let mut bar = ScrollbarState::new(len - visible + 1)
            .position(offset)
            .viewport_content_length(visible);
        // No arrow heads: ratatui draws no bar at all when they leave no
        // track, and a short terminal may show only two events.
        let bar_widget = Scrollbar::new(ScrollbarOrientation::VerticalRight)
            .begin_symbol(None)
            .end_symbol(None);
        frame.render_stateful_widget(bar_widget, list, &mut bar);
    }

    let text = d.output.as_deref().unwrap_or("");
    let lines: Vec<&str> = text.lines().collect();
    let fit = output.height.saturating_sub(1) as usize;
    let tail: Vec<Line> = lines[lines.len().saturating_sub(fit)..]
        .iter()
        .map(|l| Line::raw(l.to_string()))
        .collect();
    let body = if tail.is_empty() {
        vec![Line::styled("(no output yet)", t.dim())]
    } else {
        tail
    };
    frame.render_widget(
        Paragraph::new(body).block(block(" Output (tail) ", v)),
        output,
    );
}

fn block<'a>(title: &str, v: &View) -> Block<'a> {
    Block::new()
        .borders(Borders::TOP)
        .border_style(v.theme.border(true))
        .title(Span::styled(title.to_string(), v.theme.title(true)))
}

fn field_lines<'a>(j: &Job, v: &View) -> Vec<Line<'a>> {
    let t = v.theme;
    let kv = |k: &str, val: String| {
        Line::from(vec![
            Span::styled(format!("{k:<11}"), t.dim()),
            Span::raw(val),
        ])
    };
    let opt_t = |x: Option<chrono::DateTime<chrono::Utc>>| x.map_or("-".into(), |x| ago(x, v.now));
    let mut out = vec![
        kv("pipeline", j.pipeline.clone()),
        kv("target", j.target.clone().unwrap_or_else(|| "-".into())),
        Line::from(vec![
            Span::styled(format!("{:<11}", "state"), t.dim()),
            Span::styled(j.state.to_string(), t.state(j.state)),
        ]),
        kv("attempt", format!("{} of {}", j.attempt, j.max_attempts)),
        kv("step", progress(j, v)),
        kv("priority", j.priority.to_string()),
        kv("due", opt_t(Some(j.due_at))),
        kv("owner", j.lease_owner.clone().unwrap_or_else(|| "-".into())),
        kv(
            "lease",
            j.lease_expires_at.map_or("-".into(), |e| left(e, v.now)),
        ),
        kv("token", j.lease_token.map_or("-".into(), |x| x.to_string())),
        kv("lock", lock_text(j, v)),
        kv("on stale", j.on_stale.as_str().to_string()),
    ];
    if let Some(c) = j.cancel_requested_at {
        out.push(Line::styled(
            format!("{:<11}{}", "cancel", ago(c, v.now)),
            t.warn(),
        ));
    }
    out.extend([
        kv("created", opt_t(Some(j.created_at))),
        kv("started", opt_t(j.started_at)),
        kv("finished", opt_t(j.finished_at)),
    ]);
    if let (Some(s), Some(f)) = (j.started_at, j.finished_at) {
        out.push(kv("took", short_duration(f - s)));
    }
    if let Some(s) = j.schedule_id {
        out.push(kv("schedule", format!("#{s}")));
    }
    if !j.args.is_empty() {
        out.push(kv(
            "args",
            serde_json::Value::Object(j.args.clone()).to_string(),
        ));
    }
    if let Some(e) = &j.last_error {
        out.push(Line::styled(format!("{:<11}{e}", "last error"), t.bad()));
    }
    out
}

/// "[##--] 3/4 retention".
fn progress(j: &Job, v: &View) -> String {
    let label = v.catalog.step_label(&j.pipeline, j.step);
    let Some(total) = v.catalog.pipelines.get(&j.pipeline).map(|p| p.steps.len()) else {
        return label;
    };
    let done = (j.step.max(0) as usize).min(total);
    format!("[{}{}] {label}", "#".repeat(done), "-".repeat(total - done))
}

fn lock_text(j: &Job, v: &View) -> String {
    let Some(target) = &j.target else {
        return "none (no target)".into();
    };
    match v.snap.lock_of(target) {
        Some(l) if l.job_id == j.id => format!("holds {target}, fence {}", l.fence),
        Some(l) => format!("{target} held by #{} ({})", l.job_id, l.job_state),
        None => format!("{target} is free"),
    }
}
