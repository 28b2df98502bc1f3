//! Keys and mouse in, state changes and commands out. Pure: no I/O, so
//! every key's and click's effect is testable against a fixed snapshot.

use ratatui::crossterm::event::{KeyEvent, MouseButton, MouseEvent, MouseEventKind};
use ratatui::layout::Rect;

use crate::job::{Move, check};

use super::actions::Command;
use super::catalog::Catalog;
use super::dialogs::{Confirm, Input, Overlay, Reply};
use super::keymap::{self, Action, Context};
use super::render;
use super::snapshot::Snapshot;
use super::state::{App, Flash, Pane};

/// Rows moved by PgUp/PgDn.
pub const PAGE: isize = 10;

/// Rows moved per mouse wheel notch.
pub const WHEEL: isize = 3;

/// What the loop must do after a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    None,
    Run(Command),
    /// Drain this node's jobs, then exit.
    Quit,
    /// Stop this node's steps at once, then exit.
    QuitNow,
}

pub fn on_key(app: &mut App, key: &KeyEvent, snap: &Snapshot, catalog: &Catalog) -> Effect {
    if let Some(overlay) = app.overlay.as_mut() {
        let reply = match overlay {
            // Any key closes the help; it never falls through to an action.
            Overlay::Help => Reply::Dismissed,
            Overlay::Confirm(c) => c.key(key),
            Overlay::Input(i) => i.key(key),
        };
        return match reply {
            Reply::Open => Effect::None,
            Reply::Dismissed => {
                app.overlay = None;
                Effect::None
            }
            Reply::Run(cmd) => {
                app.overlay = None;
                app.marked.clear();
                Effect::Run(cmd)
            }
            Reply::SetFilter(text) => {
                app.overlay = None;
                app.filter = text;
                app.selected = [0; 8];
                Effect::None
            }
        };
    }
    let ctx = Context {
        pane: app.focus,
        detail: app.detail.is_some(),
    };
    let Some(action) = keymap::lookup(key, ctx, app.mode()) else {
        if let Some(b) = keymap::binding_for(key, ctx)
            && let Some(why) = app.mode().refusal(b)
        {
            app.flash = Some(Flash::err(format!(
                "{why}: {} ({}) is disabled",
                b.label,
                app.mode().description(b)
            )));
        }
        return Effect::None;
    };
    // The flash answers the previous action; left up, it would read as the
    // answer to this one (or sit under the dialog this one opens).
    app.flash = None;
    apply(app, action, snap, catalog)
}

/// What a mouse event does, worked out before anything changes.
enum Gesture {
    Tab(Pane),
    Click(Pane, Option<usize>),
    Wheel(Pane, isize),
    /// The wheel in the detail view: its events.
    Events(isize),
}

/// Click focuses the pane under the pointer and selects the row; the
/// wheel scrolls the pane under it, or the detail view's events.
/// Overlays swallow the mouse. `area` is the whole terminal, as drawn.
pub fn on_mouse(app: &mut App, m: &MouseEvent, area: Rect, snap: &Snapshot) {
    let Some(gesture) = gesture(app, m, area, snap) else {
        return;
    };
    // As for a key: the flash answered the previous action. Cleared before
    // acting, so that a flash this gesture raises would stay up.
    app.flash = None;
    match gesture {
        Gesture::Tab(p) => {
            app.detail = None;
            app.focus(p);
        }
        Gesture::Click(pane, row) => {
            app.focus(pane);
            if let Some(row) = row.filter(|r| *r < pane.len(snap)) {
                app.select(pane, row);
            }
        }
        Gesture::Wheel(pane, delta) => {
            app.focus(pane);
            app.move_by(delta, snap);
        }
        Gesture::Events(delta) => app.scroll_events(delta, snap),
    }
}

/// `None` for what does nothing (a move, a button we do not use, a click
/// beside the panes), which, like an unbound key, leaves the flash up.
fn gesture(app: &App, m: &MouseEvent, area: Rect, snap: &Snapshot) -> Option<Gesture> {
    if app.overlay.is_some() || render::too_small(area) {
        return None;
    }
    let areas = render::layout(area, app, render::job_rows(snap));
    let click = m.kind == MouseEventKind::Down(MouseButton::Left);
    let wheel = match m.kind {
        MouseEventKind::ScrollDown => Some(WHEEL),
        MouseEventKind::ScrollUp => Some(-WHEEL),
        _ => None,
    };
    if click
        && let Some(tabs) = areas.tabs
        && m.row == tabs.y
    {
        return render::tab_at(m.column.saturating_sub(tabs.x)).map(Gesture::Tab);
    }
    if app.detail.is_some() {
        return wheel.map(Gesture::Events);
    }
    let (pane, row) = areas.hit(m.column, m.row, app)?;
    if click {
        Some(Gesture::Click(pane, row))
    } else {
        wheel.map(|delta| Gesture::Wheel(pane, delta))
    }
}

pub fn apply(app: &mut App, action: Action, snap: &Snapshot, catalog: &Catalog) -> Effect {
    match action {
        Action::FocusNext => focus(app, app.focus.next()),
        Action::FocusPrev => focus(app, app.focus.prev()),
        Action::Focus(p) => focus(app, p),
        Action::Up => move_by(app, -1, snap),
        Action::Down => move_by(app, 1, snap),
        Action::PageUp => move_by(app, -PAGE, snap),
        Action::PageDown => move_by(app, PAGE, snap),
        Action::Top => move_by(app, isize::MIN / 2, snap),
        Action::Bottom => move_by(app, isize::MAX / 2, snap),
        Action::Open => app.open_detail(app.selected_job(snap).map(|j| j.id)),
        Action::Back => back(app),
        Action::Mark => {
            if let Some(id) = app.selected_job(snap).map(|j| j.id) {
                if !app.marked.remove(&id) {
                    app.marked.insert(id);
                }
                app.move_by(1, snap);
            }
        }
        Action::Cancel => return ask(app, Command::Cancel(app.targets(snap))),
        Action::Requeue => return ask(app, Command::Requeue(app.targets(snap))),
        Action::Extend => {
            let ids = app.targets(snap);
            // One lease length of the job's own pipeline; with several jobs
            // marked, the longest of theirs, so none gets less than its lease.
            let by = ids
                .iter()
                .filter_map(|id| snap.job(*id))
                .map(|j| catalog.lease(&j.pipeline))
                .max();
            return match by {
                Some(by) => Effect::Run(Command::Extend { ids, by }),
                None => nothing_selected(app),
            };
        }
        Action::ExtendBy => {
            let ids = app.targets(snap);
            if ids.is_empty() {
                return nothing_selected(app);
            }
            app.overlay = Some(Overlay::Input(Input::extend_by(ids)));
        }
        Action::ReleaseLock => {
            let Some(lock) = app.selected_row(Pane::Locks, snap).map(|i| &snap.locks[i]) else {
                return nothing_selected(app);
            };
            // Refuse here, in the store's words, rather than ask a y/n
            // question whose answer can only be refused.
            if let Err(e) = check(lock.job_id, lock.job_state, Move::ReleaseLock) {
                app.flash = Some(Flash::err(e.to_string()));
                return Effect::None;
            }
            return ask(app, Command::ReleaseLock(lock.target.clone()));
        }
        Action::FireNow | Action::ToggleSchedule => {
            let Some(s) = app
                .selected_row(Pane::Schedules, snap)
                .map(|i| &snap.schedules[i])
            else {
                return nothing_selected(app);
            };
            return Effect::Run(if action == Action::FireNow {
                Command::FireNow {
                    id: s.id,
                    name: s.def.name.clone(),
                }
            } else {
                Command::SetSchedulePaused {
                    name: s.def.name.clone(),
                    paused: !s.paused,
                }
            });
        }
        Action::Filter => app.overlay = Some(Overlay::Input(Input::filter(&app.filter))),
        Action::Enqueue => {
            let pipeline = app
                .selected_job(snap)
                .map(|j| j.pipeline.clone())
                .or_else(|| catalog.pipelines.keys().next().cloned())
                .unwrap_or_default();
            app.overlay = Some(Overlay::Input(Input::enqueue(&pipeline)));
        }
        Action::PauseNode => return Effect::Run(Command::ToggleNodePause),
        Action::SlotsUp => return Effect::Run(Command::Slots(1)),
        Action::SlotsDown => return Effect::Run(Command::Slots(-1)),
        Action::Help => app.overlay = Some(Overlay::Help),
        Action::Quit => return Effect::Quit,
        Action::QuitNow => return Effect::QuitNow,
    }
    Effect::None
}

/// The detail view's list is its events; elsewhere, the focused pane's rows.
fn move_by(app: &mut App, delta: isize, snap: &Snapshot) {
    if app.detail.is_some() {
        app.scroll_events(delta, snap);
    } else {
        app.move_by(delta, snap);
    }
}

fn focus(app: &mut App, pane: Pane) {
    app.detail = None;
    app.focus(pane);
}

/// Esc peels one layer: detail view, then marks, then the filter.
fn back(app: &mut App) {
    if app.detail.take().is_some() {
        return;
    }
    if !app.marked.is_empty() {
        app.marked.clear();
        return;
    }
    app.filter.clear();
}

fn ask(app: &mut App, command: Command) -> Effect {
    match &command {
        Command::Cancel(ids) | Command::Requeue(ids) if ids.is_empty() => nothing_selected(app),
        _ => {
            let question = command.question().unwrap_or_default();
            app.overlay = Some(Overlay::Confirm(Confirm { question, command }));
            Effect::None
        }
    }
}

fn nothing_selected(app: &mut App) -> Effect {
    app.flash = Some(Flash::err("nothing selected"));
    Effect::None
}
