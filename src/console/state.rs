//! What the operator has done to the view: focus, selection, marks, filter,
//! open dialogs, the flash line. No I/O here; `update` changes it and
//! `render` reads it.

use std::cell::Cell;
use std::collections::BTreeSet;

use crate::job::{Event, Job};

use super::dialogs::Overlay;
use super::keymap::Mode;
use super::snapshot::Snapshot;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pane {
    Queued,
    Leased,
    Running,
    Stale,
    Locks,
    Workers,
    Finished,
    Schedules,
}

impl Pane {
    pub const ALL: [Pane; 8] = [
        Pane::Queued,
        Pane::Leased,
        Pane::Running,
        Pane::Stale,
        Pane::Locks,
        Pane::Workers,
        Pane::Finished,
        Pane::Schedules,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// The key that focuses it: 1–8.
    pub fn number(self) -> usize {
        self.index() + 1
    }

    pub fn from_number(n: usize) -> Option<Pane> {
        n.checked_sub(1).and_then(|i| Pane::ALL.get(i)).copied()
    }

    pub fn title(self) -> &'static str {
        match self {
            Pane::Queued => "Queued",
            Pane::Leased => "Leased",
            Pane::Running => "Running",
            Pane::Stale => "Stale",
            Pane::Locks => "Locks",
            Pane::Workers => "Workers",
            Pane::Finished => "Finished",
            Pane::Schedules => "Schedules",
        }
    }

    pub fn next(self) -> Pane {
        Pane::ALL[(self.index() + 1) % Pane::ALL.len()]
    }

    pub fn prev(self) -> Pane {
        Pane::ALL[(self.index() + Pane::ALL.len() - 1) % Pane::ALL.len()]
    }

    /// Panes whose rows are jobs (and so can be opened, marked, cancelled).
    pub fn shows_jobs(self) -> bool {
        matches!(
            self,
            Pane::Queued | Pane::Leased | Pane::Running | Pane::Stale | Pane::Finished
        )
    }

    /// The wide layout shows one of these at a time in its bottom-right
    /// corner, the one last focused.
    pub fn is_side(self) -> bool {
        matches!(self, Pane::Workers | Pane::Finished | Pane::Schedules)
    }

    /// The jobs a pane shows, when it shows jobs.
    pub fn jobs(self, snap: &Snapshot) -> &[Job] {
        match self {
            Pane::Queued => &snap.queued,
            Pane::Leased => &snap.leased,
            Pane::Running => &snap.running,
            Pane::Stale => &snap.stale,
            Pane::Finished => &snap.finished,
            _ => &[],
        }
    }

    pub fn len(self, snap: &Snapshot) -> usize {
        match self {
            Pane::Locks => snap.locks.len(),
            Pane::Workers => snap.workers.len(),
            Pane::Schedules => snap.schedules.len(),
            p => p.jobs(snap).len(),
        }
    }
}

/// The result of the last action, shown in the footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    pub text: String,
    pub error: bool,
}

impl Flash {
    pub fn ok(text: impl Into<String>) -> Flash {
        Flash {
            text: text.into(),
            error: false,
        }
    }
    pub fn err(text: impl Into<String>) -> Flash {
        Flash {
            text: text.into(),
            error: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct App {
    pub focus: Pane,
    /// Which of Workers/Finished/Schedules the wide layout shows.
    pub side: Pane,
    /// Selected row per pane (clamped to the rows present when used).
    pub selected: [usize; 8],
    /// First visible row per pane, written by the draw so that scrolling is
    /// stable between frames (the draw otherwise only reads the state).
    pub offset: [Cell<usize>; 8],
    /// Jobs marked with Space; `c` and `r` act on these when any.
    pub marked: BTreeSet<i64>,
    /// Active text filter (id, pipeline, target).
    pub filter: String,
    /// The job whose detail view is open.
    pub detail: Option<i64>,
    /// The detail view's selected event; `None` follows the newest, so a
    /// job watched without touching a key shows its latest events.
    pub detail_event: Option<usize>,
    /// First visible event of the detail view, written by the draw like
    /// `offset`.
    pub detail_offset: Cell<usize>,
    pub overlay: Option<Overlay>,
    pub flash: Option<Flash>,
    pub readonly: bool,
    /// This node's engine is embedded; without it (`--no-workers`) the keys
    /// that act on it are unbound.
    pub engine: bool,
    /// Set once `q` was pressed: the drain is under way.
    pub draining: bool,
}

impl App {
    /// With this node's engine, as consoles mostly are; `run` clears
    /// `engine` for `--no-workers`.
    pub fn new(readonly: bool) -> App {
        App {
            focus: Pane::Queued,
            side: Pane::Workers,
            selected: [0; 8],
            offset: Default::default(),
            marked: BTreeSet::new(),
            filter: String::new(),
            detail: None,
            detail_event: None,
            detail_offset: Cell::new(0),
            overlay: None,
            flash: None,
            readonly,
            engine: true,
            draining: false,
        }
    }

    pub fn mode(&self) -> Mode {
        Mode {
            readonly: self.readonly,
            engine: self.engine,
        }
    }

    pub fn focus(&mut self, pane: Pane) {
        self.focus = pane;
        if pane.is_side() {
            self.side = pane;
        }
    }

    /// The selected row of `pane`, clamped to what the snapshot holds.
    pub fn selected_row(&self, pane: Pane, snap: &Snapshot) -> Option<usize> {
        let len = pane.len(snap);
        (len > 0).then(|| self.selected[pane.index()].min(len - 1))
    }

    /// Move the selection of the focused pane by `delta` rows.
    pub fn move_by(&mut self, delta: isize, snap: &Snapshot) {
        let pane = self.focus;
        let len = pane.len(snap);
        if len == 0 {
            self.selected[pane.index()] = 0;
            return;
        }
        let cur = self.selected[pane.index()].min(len - 1) as isize;
        self.selected[pane.index()] = (cur + delta).clamp(0, len as isize - 1) as usize;
    }

    /// Open the detail view of `job` at its newest events.
    pub fn open_detail(&mut self, job: Option<i64>) {
        self.detail = job;
        self.detail_event = None;
        self.detail_offset.set(0);
    }

    /// Move the detail view's event selection by `delta` rows; reaching the
    /// newest follows new events again.
    pub fn scroll_events(&mut self, delta: isize, snap: &Snapshot) {
        let len = self.detail_events(snap).len();
        let Some(cur) = self.selected_event(len) else {
            return;
        };
        let last = len - 1;
        let next = (cur as isize + delta).clamp(0, last as isize) as usize;
        self.detail_event = (next < last).then_some(next);
    }

    /// The detail view's selected event among `len`: the chosen one, or the
    /// newest when following; `None` without events.
    pub fn selected_event(&self, len: usize) -> Option<usize> {
        let last = len.checked_sub(1)?;
        Some(self.detail_event.unwrap_or(last).min(last))
    }

    /// The events of the open detail view, once fetched.
    pub fn detail_events<'a>(&self, snap: &'a Snapshot) -> &'a [Event] {
        snap.detail
            .as_ref()
            .filter(|d| Some(d.job.id) == self.detail)
            .map_or(&[], |d| &d.events)
    }

    pub fn select(&mut self, pane: Pane, row: usize) {
        self.selected[pane.index()] = row;
    }

    /// Keep the focused pane's selection on the same job, lock, worker or
    /// schedule when a refresh inserts or removes rows above it, so that a
    /// key pressed just after a refresh acts on the row the operator chose.
    /// A row that is gone leaves the selection where it was. Other panes
    /// keep their position: their selection is not shown, and following
    /// it would drift a pane never looked at away from its top row.
    pub fn follow(&mut self, old: &Snapshot, new: &Snapshot) {
        let pane = self.focus;
        let Some(key) = self
            .selected_row(pane, old)
            .and_then(|row| row_key(pane, old, row))
        else {
            return;
        };
        if let Some(row) = (0..pane.len(new)).find(|&i| row_key(pane, new, i) == Some(key)) {
            self.selected[pane.index()] = row;
        }
    }

    /// The job the operator is pointing at: the detail view's, else the
    /// focused pane's selected row.
    pub fn selected_job<'a>(&self, snap: &'a Snapshot) -> Option<&'a Job> {
        if let Some(id) = self.detail {
            return snap.job(id);
        }
        let row = self.selected_row(self.focus, snap)?;
        self.focus.jobs(snap).get(row)
    }

    /// The jobs `c`/`r` act on: the marked ones, else the selected one.
    pub fn targets(&self, snap: &Snapshot) -> Vec<i64> {
        if !self.marked.is_empty() && self.detail.is_none() {
            return self.marked.iter().copied().collect();
        }
        self.selected_job(snap).map(|j| j.id).into_iter().collect()
    }
}

/// What names a row across refreshes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowKey<'a> {
    Id(i64),
    Name(&'a str),
}

fn row_key(pane: Pane, snap: &Snapshot, row: usize) -> Option<RowKey<'_>> {
    Some(match pane {
        Pane::Locks => RowKey::Name(&snap.locks.get(row)?.target),
        Pane::Workers => RowKey::Name(&snap.workers.get(row)?.id),
        Pane::Schedules => RowKey::Id(snap.schedules.get(row)?.id),
        p => RowKey::Id(p.jobs(snap).get(row)?.id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::fixture;

    #[test]
    fn selection_follows_its_row_across_refreshes() {
        let old = fixture::snapshot();
        let mut app = App::new(false);
        app.focus(Pane::Locks);
        app.select(Pane::Locks, 1);
        app.select(Pane::Running, 1);
        let lock = old.locks[1].target.clone();
        let job = old.running[1].id;

        // The first lock is released and the first running job finishes.
        let mut new = old.clone();
        new.locks.remove(0);
        new.running.remove(0);
        app.follow(&old, &new);
        assert_eq!(app.selected[Pane::Locks.index()], 0);
        assert_eq!(new.locks[0].target, lock);
        // Running is not focused: its selection keeps its position.
        assert_eq!(app.selected[Pane::Running.index()], 1);
        app.focus(Pane::Running);
        let mut newer = new.clone();
        let mut extra = old.running[0].clone();
        extra.id = 999;
        newer.running.insert(0, old.running[0].clone());
        newer.running.insert(0, extra);
        app.follow(&new, &newer);
        assert_eq!(newer.running[app.selected[Pane::Running.index()]].id, job);
        app.focus(Pane::Locks);

        // A row appears above: the selection moves down with its row.
        let mut newer = new.clone();
        newer.locks.insert(0, old.locks[0].clone());
        app.follow(&new, &newer);
        assert_eq!(newer.locks[app.selected[Pane::Locks.index()]].target, lock);

        // The selected row itself goes: the position stays.
        let mut gone = newer.clone();
        gone.locks.retain(|l| l.target != lock);
        app.follow(&newer, &gone);
        assert_eq!(app.selected[Pane::Locks.index()], 1);
    }
}
