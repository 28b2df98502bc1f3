//! The eight panes as tables: a shared frame (title, counts, selection,
//! scrolling) around the rows that `jobs.rs` and `cluster.rs` build.

mod cluster;
mod jobs;

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Row, Table, TableState};

use super::View;
use crate::console::state::Pane;
use crate::job::State;

/// Column headings, widths and the rows of one pane.
pub struct Grid<'a> {
    pub header: &'static [&'static str],
    pub widths: Vec<Constraint>,
    pub rows: Vec<Row<'a>>,
}

pub fn draw(frame: &mut Frame, area: Rect, pane: Pane, v: &View) {
    let t = v.theme;
    let focused = v.app.focus == pane;
    let grid = match pane {
        Pane::Queued => jobs::queued(v),
        Pane::Leased => jobs::leased(v),
        Pane::Running => jobs::running(v),
        Pane::Stale => jobs::stale(v),
        Pane::Finished => jobs::finished(v),
        Pane::Locks => cluster::locks(v),
        Pane::Workers => cluster::workers(v),
        Pane::Schedules => cluster::schedules(v),
    };
    let len = grid.rows.len();
    let block = Block::new()
        .borders(Borders::TOP)
        .border_style(t.border(focused))
        .title(Line::from(vec![Span::styled(
            title(pane, v),
            t.title(focused),
        )]));
    let header = Row::new(grid.header.iter().map(|h| Cell::from(*h)))
        .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let rows = if len == 0 {
        vec![Row::new([Cell::from(Span::styled(
            empty(pane, v),
            t.dim(),
        ))])]
    } else {
        grid.rows
    };
    let widths = if len == 0 {
        vec![Constraint::Fill(1)]
    } else {
        grid.widths
    };
    let table = Table::new(rows, widths)
        .header(header)
        .block(block)
        .column_spacing(1)
        .row_highlight_style(t.selected());

    let visible = area.height.saturating_sub(2) as usize;
    let selected = v.app.selected_row(pane, v.snap);
    let offset = scroll(v.app.offset[pane.index()].get(), selected, visible, len);
    v.app.offset[pane.index()].set(offset);
    let mut state = TableState::default()
        .with_offset(offset)
        .with_selected(selected.filter(|_| focused));
    frame.render_stateful_widget(table, area, &mut state);
}

/// Keep the previous offset unless the selection left the window.
pub(super) fn scroll(prev: usize, selected: Option<usize>, visible: usize, len: usize) -> usize {
    let visible = visible.max(1);
    let mut off = prev.min(len.saturating_sub(visible));
    if let Some(sel) = selected {
        if sel < off {
            off = sel;
        } else if sel >= off + visible {
            off = sel + 1 - visible;
        }
    }
    off
}

/// " 1 Queued 12 " — the cluster total, not only the rows fetched.
fn title(pane: Pane, v: &View) -> String {
    let s = v.snap;
    let total = match pane {
        Pane::Queued => s.count(State::Queued).to_string(),
        Pane::Leased => s.count(State::Leased).to_string(),
        Pane::Running => s.count(State::Running).to_string(),
        Pane::Stale => s.count(State::Stale).to_string(),
        Pane::Finished => {
            (s.count(State::Succeeded) + s.count(State::Failed) + s.count(State::Cancelled))
                .to_string()
        }
        Pane::Locks => s.locks.len().to_string(),
        Pane::Workers => {
            let live = s.workers.iter().filter(|w| !w.gone).count();
            format!("{live}/{}", s.workers.len())
        }
        Pane::Schedules => s.schedules.len().to_string(),
    };
    let filtered = if pane.shows_jobs() && !v.app.filter.is_empty() {
        format!(" /{}", v.app.filter)
    } else {
        String::new()
    };
    format!(" {} {} {total}{filtered} ", pane.number(), pane.title())
}

fn empty(pane: Pane, v: &View) -> String {
    if pane.shows_jobs() && !v.app.filter.is_empty() {
        return format!(
            "no {} job matches {:?}",
            pane.title().to_lowercase(),
            v.app.filter
        );
    }
    match pane {
        Pane::Locks => "no target is locked".into(),
        Pane::Workers => "no worker has registered".into(),
        Pane::Schedules => "no schedules".into(),
        Pane::Finished => "no finished jobs".into(),
        p => format!("no {} jobs", p.title().to_lowercase()),
    }
}
