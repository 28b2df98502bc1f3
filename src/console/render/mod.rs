//! Drawing only: everything comes from a [`View`] built from the last
//! snapshot, the app state and the clock the caller passes in, so the same
//! inputs always draw the same screen (what the snapshot tests rely on).

mod detail;
mod footer;
mod header;
mod overlay;
pub mod panes;
pub mod theme;

use std::time::Duration;

use chrono::{DateTime, Utc};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Tabs, Wrap};

use crate::engine::EngineStatus;

use super::catalog::Catalog;
use super::snapshot::Snapshot;
use super::state::{App, Pane};
pub use theme::Theme;

/// Below this the console shows a "terminal too small" message.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 10;
/// From this size on every pane is on screen at once; below it, one pane
/// at a time with a tab bar.
pub const WIDE_WIDTH: u16 = 100;
pub const WIDE_HEIGHT: u16 = 28;

/// Everything one frame needs.
pub struct View<'a> {
    pub app: &'a App,
    pub snap: &'a Snapshot,
    /// This node's engine; `None` with `--no-workers`.
    pub engine: Option<&'a EngineStatus>,
    pub node_id: &'a str,
    /// The database URL, password already redacted.
    pub db: &'a str,
    pub catalog: &'a Catalog,
    pub theme: Theme,
    /// The database's "now" (local clock plus the measured skew).
    pub now: DateTime<Utc>,
    /// Time left before a drain stops the running jobs, while draining.
    pub drain_left: Option<Duration>,
}

/// Where things are on screen; shared by drawing and mouse handling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Areas {
    pub header: Rect,
    pub tabs: Option<Rect>,
    pub panes: Vec<(Pane, Rect)>,
    /// The detail view's area when it is open.
    pub detail: Option<Rect>,
    pub footer: Rect,
}

impl Areas {
    /// The pane at a screen position, and the data row under it if any.
    pub fn hit(&self, x: u16, y: u16, app: &App) -> Option<(Pane, Option<usize>)> {
        let (pane, r) = self
            .panes
            .iter()
            .find(|(_, r)| r.contains(ratatui::layout::Position { x, y }))?;
        // Title line, then the column header, then rows.
        let row = (y >= r.y + 2).then(|| (y - r.y - 2) as usize + app.offset[pane.index()].get());
        Some((*pane, row))
    }
}

pub fn too_small(area: Rect) -> bool {
    area.width < MIN_WIDTH || area.height < MIN_HEIGHT
}

pub fn is_wide(area: Rect) -> bool {
    area.width >= WIDE_WIDTH && area.height >= WIDE_HEIGHT
}

/// `rows`: how many rows each of Queued, Leased, Running, Stale holds, so
/// that a busy pane gets the lines an empty one does not need.
pub fn layout(area: Rect, app: &App, rows: [usize; 4]) -> Areas {
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Fill(1),
        Constraint::Length(2),
    ])
    .areas(area);
    let mut areas = Areas {
        header,
        tabs: None,
        panes: Vec::new(),
        detail: None,
        footer,
    };
    let body = if is_wide(area) {
        body
    } else {
        let [tabs, rest] =
            Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(body);
        areas.tabs = Some(tabs);
        rest
    };
    if app.detail.is_some() {
        areas.detail = Some(body);
    } else if is_wide(area) {
        let [q, l, r, s, bottom] = stack(body, rows);
        let [locks, side] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .spacing(1)
                .areas(bottom);
        areas.panes = vec![
            (Pane::Queued, q),
            (Pane::Leased, l),
            (Pane::Running, r),
            (Pane::Stale, s),
            (Pane::Locks, locks),
            (app.side, side),
        ];
    } else {
        areas.panes = vec![(app.focus, body)];
    }
    areas
}

pub fn draw(frame: &mut Frame, v: &View) {
    let area = frame.area();
    if too_small(area) {
        let msg = format!(
            "terminal too small: {}×{} (need at least {MIN_WIDTH}×{MIN_HEIGHT})",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(msg).wrap(Wrap { trim: true }), area);
        return;
    }
    let areas = layout(area, v.app, job_rows(v.snap));
    header::draw(frame, areas.header, v);
    if let Some(tabs) = areas.tabs {
        draw_tabs(frame, tabs, v);
    }
    for (pane, rect) in &areas.panes {
        panes::draw(frame, *rect, *pane, v);
    }
    if let Some(rect) = areas.detail {
        detail::draw(frame, rect, v);
    }
    footer::draw(frame, areas.footer, v);
    overlay::draw(frame, area, v);
}

fn tab_title(p: Pane) -> String {
    format!("{} {}", p.number(), p.title())
}

/// The tab under column `x` of the tab bar (titles joined by a one-column
/// divider, as drawn).
pub fn tab_at(x: u16) -> Option<Pane> {
    let mut start = 0u16;
    for p in Pane::ALL {
        let end = start + tab_title(p).chars().count() as u16;
        if x < end {
            return Some(p);
        }
        start = end + 1;
    }
    None
}

fn draw_tabs(frame: &mut Frame, area: Rect, v: &View) {
    let titles: Vec<Line> = Pane::ALL
        .iter()
        .map(|p| Line::from(tab_title(*p)))
        .collect();
    let tabs = Tabs::new(titles)
        .select(v.app.focus.index())
        .highlight_style(v.theme.title(true))
        .divider("│")
        .padding("", "");
    frame.render_widget(tabs, area);
}

pub fn job_rows(snap: &Snapshot) -> [usize; 4] {
    [Pane::Queued, Pane::Leased, Pane::Running, Pane::Stale].map(|p| p.len(snap))
}

/// Heights of the four job panes and the bottom row. Each job pane wants
/// its rows plus title and column header (at least one row); the bottom
/// row keeps a quarter of the body; when the wishes do not fit they shrink
/// in proportion, and space left over goes to the bottom row.
fn stack(body: Rect, rows: [usize; 4]) -> [Rect; 5] {
    const MIN: u16 = 3;
    let bottom_min = (body.height / 4).max(6);
    let room = body.height.saturating_sub(bottom_min);
    let want = rows.map(|r| (r as u16).saturating_add(2).max(MIN));
    let total: u32 = want.iter().map(|&w| w as u32).sum();
    let heights = if total <= room as u32 {
        want
    } else {
        // Everyone gets MIN, the rest is shared by how much more each wants.
        let spare = room.saturating_sub(4 * MIN) as u32;
        let extra: u32 = want.iter().map(|&w| (w - MIN) as u32).sum::<u32>().max(1);
        want.map(|w| MIN + ((w - MIN) as u32 * spare / extra) as u16)
    };
    let mut out = [Rect::default(); 5];
    let mut y = body.y;
    for (i, h) in heights.into_iter().enumerate() {
        let h = h.min(body.bottom().saturating_sub(y));
        out[i] = Rect::new(body.x, y, body.width, h);
        y += h;
    }
    out[4] = Rect::new(body.x, y, body.width, body.bottom().saturating_sub(y));
    out
}
