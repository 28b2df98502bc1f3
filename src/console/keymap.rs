//! The one table of keys. Every binding carries its description and whether
//! it changes anything; the footer hints and the help overlay are generated
//! from it, and `--readonly` simply leaves the mutating ones unbound, as
//! `--no-workers` does the ones that act on this node's engine (and words
//! the ones whose effect shrinks without it, such as the quit keys).

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::state::Pane;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    FocusNext,
    FocusPrev,
    Focus(Pane),
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    Open,
    Back,
    Mark,
    Cancel,
    Requeue,
    Extend,
    ExtendBy,
    ReleaseLock,
    FireNow,
    ToggleSchedule,
    Filter,
    Enqueue,
    PauseNode,
    SlotsUp,
    SlotsDown,
    Help,
    Quit,
    QuitNow,
}

impl Action {
    /// Acts on this node's engine, which a `--no-workers` console has not.
    pub fn needs_engine(self) -> bool {
        matches!(
            self,
            Action::PauseNode | Action::SlotsUp | Action::SlotsDown
        )
    }
}

/// Where a binding applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Global,
    /// Any pane is focused: everywhere but the detail view, whose one job
    /// has no rows to mark or filter.
    Panes,
    /// A job pane is focused (not the detail view).
    Rows,
    /// A job pane is focused, or the detail view is open.
    Jobs,
    Locks,
    Schedules,
}

impl Scope {
    pub fn title(self) -> &'static str {
        match self {
            Scope::Global => "everywhere",
            Scope::Panes => "all panes (not the detail)",
            Scope::Rows => "job panes",
            Scope::Jobs => "job panes and detail",
            Scope::Locks => "Locks",
            Scope::Schedules => "Schedules",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Binding {
    pub keys: &'static [KeyCode],
    /// How the key is written in hints and help.
    pub label: &'static str,
    pub action: Action,
    pub description: &'static str,
    /// Changes jobs, locks, schedules or this node: unbound in `--readonly`.
    pub mutating: bool,
    pub scope: Scope,
    /// Shown in the footer (the movement keys are left to the help).
    pub hint: bool,
    /// The description without this node's engine, for a key that still
    /// works there but does less; read it through [`Mode::description`].
    pub without_engine: Option<&'static str>,
}

impl Binding {
    const fn without_engine(self, description: &'static str) -> Binding {
        Binding {
            without_engine: Some(description),
            ..self
        }
    }
}

use KeyCode::{BackTab, Char, Down, End, Enter, Esc, Home, PageDown, PageUp, Tab, Up};

const fn b(
    keys: &'static [KeyCode],
    label: &'static str,
    action: Action,
    description: &'static str,
    mutating: bool,
    scope: Scope,
    hint: bool,
) -> Binding {
    Binding {
        keys,
        label,
        action,
        description,
        mutating,
        scope,
        hint,
        without_engine: None,
    }
}

/// A key bound in several scopes has its narrower bindings first: the first
/// in scope wins (`r` fires a schedule in Schedules, requeues elsewhere).
pub const BINDINGS: &[Binding] = &[
    b(
        &[Char('r')],
        "r",
        Action::FireNow,
        "fire the schedule now",
        true,
        Scope::Schedules,
        true,
    ),
    b(
        &[Char('s')],
        "s",
        Action::ToggleSchedule,
        "pause/resume the schedule",
        true,
        Scope::Schedules,
        true,
    ),
    b(
        &[Char('x')],
        "x",
        Action::ReleaseLock,
        "release a stale holder's lock",
        true,
        Scope::Locks,
        true,
    ),
    b(
        &[Enter],
        "Enter",
        Action::Open,
        "job detail",
        false,
        Scope::Rows,
        true,
    ),
    b(
        &[Char(' ')],
        "Space",
        Action::Mark,
        "mark/unmark the row",
        false,
        Scope::Rows,
        true,
    ),
    b(
        &[Char('c')],
        "c",
        Action::Cancel,
        "cancel the marked or selected jobs",
        true,
        Scope::Jobs,
        true,
    ),
    b(
        &[Char('r')],
        "r",
        Action::Requeue,
        "requeue the marked or selected jobs",
        true,
        Scope::Jobs,
        true,
    ),
    b(
        &[Char('e')],
        "e",
        Action::Extend,
        "extend the lease by one lease length",
        true,
        Scope::Jobs,
        true,
    ),
    b(
        &[Char('E')],
        "E",
        Action::ExtendBy,
        "extend the lease by a typed duration",
        true,
        Scope::Jobs,
        false,
    ),
    b(
        &[Tab],
        "Tab",
        Action::FocusNext,
        "next pane",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[BackTab],
        "S-Tab",
        Action::FocusPrev,
        "previous pane",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[
            Char('1'),
            Char('2'),
            Char('3'),
            Char('4'),
            Char('5'),
            Char('6'),
            Char('7'),
            Char('8'),
        ],
        "1-8",
        Action::Focus(Pane::Queued),
        "focus a pane (1 Queued … 8 Schedules)",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[Char('j'), Down],
        "j/↓",
        Action::Down,
        "next row",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[Char('k'), Up],
        "k/↑",
        Action::Up,
        "previous row",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[PageDown],
        "PgDn",
        Action::PageDown,
        "page down",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[PageUp],
        "PgUp",
        Action::PageUp,
        "page up",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[Char('g'), Home],
        "g",
        Action::Top,
        "first row",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[Char('G'), End],
        "G",
        Action::Bottom,
        "last row",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[Esc],
        "Esc",
        Action::Back,
        "back / clear marks and filter",
        false,
        Scope::Global,
        false,
    ),
    b(
        &[Char('/')],
        "/",
        Action::Filter,
        "filter rows by id, pipeline, target",
        false,
        Scope::Panes,
        true,
    ),
    b(
        &[Char('n')],
        "n",
        Action::Enqueue,
        "enqueue a job",
        true,
        Scope::Global,
        true,
    ),
    b(
        &[Char('p')],
        "p",
        Action::PauseNode,
        "pause/resume this node's claiming",
        true,
        Scope::Global,
        true,
    ),
    b(
        &[Char('+'), Char('=')],
        "+",
        Action::SlotsUp,
        "one more slot on this node",
        true,
        Scope::Global,
        false,
    ),
    b(
        &[Char('-')],
        "-",
        Action::SlotsDown,
        "one slot less on this node",
        true,
        Scope::Global,
        false,
    ),
    b(
        &[Char('?')],
        "?",
        Action::Help,
        "help",
        false,
        Scope::Global,
        true,
    ),
    b(
        &[Char('q')],
        "q",
        Action::Quit,
        "quit (drain this node's jobs)",
        false,
        Scope::Global,
        true,
    )
    .without_engine("quit"),
    b(
        &[Char('Q')],
        "Q",
        Action::QuitNow,
        "quit now (stop this node's steps)",
        false,
        Scope::Global,
        false,
    )
    // Kept bound: an operator used to Q still gets out, and exits at once
    // just as q does.
    .without_engine("quit (as q: this node runs no steps to stop)"),
];

/// Where the operator is, for scoping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    pub pane: Pane,
    pub detail: bool,
}

impl Context {
    pub fn in_scope(self, scope: Scope) -> bool {
        match scope {
            Scope::Global => true,
            Scope::Panes => !self.detail,
            Scope::Rows => !self.detail && self.pane.shows_jobs(),
            Scope::Jobs => self.detail || self.pane.shows_jobs(),
            Scope::Locks => !self.detail && self.pane == Pane::Locks,
            Scope::Schedules => !self.detail && self.pane == Pane::Schedules,
        }
    }
}

/// How the console was started, which decides the keys it binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// `--readonly`: keys that change anything are unbound.
    pub readonly: bool,
    /// This node's engine is embedded (not `--no-workers`).
    pub engine: bool,
}

impl Mode {
    /// Why `b` is unbound in this mode, in the flash's words; `None` when
    /// it is bound.
    pub fn refusal(self, b: &Binding) -> Option<&'static str> {
        if self.readonly && b.mutating {
            Some("read-only console")
        } else if !self.engine && b.action.needs_engine() {
            Some("this console runs no workers (--no-workers)")
        } else {
            None
        }
    }

    /// What `b` does in this mode, for the help, the hints and the flash.
    pub fn description(self, b: &Binding) -> &'static str {
        match b.without_engine {
            Some(d) if !self.engine => d,
            _ => b.description,
        }
    }
}

/// The bindings in effect in `mode`.
pub fn active(mode: Mode) -> impl Iterator<Item = &'static Binding> {
    BINDINGS.iter().filter(move |b| mode.refusal(b).is_none())
}

/// The binding for `key` in `ctx`, whatever the [`Mode`] (callers use it to
/// explain a refused key).
pub fn binding_for(key: &KeyEvent, ctx: Context) -> Option<&'static Binding> {
    if key
        .modifiers
        .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
    {
        return None;
    }
    BINDINGS
        .iter()
        .find(|b| ctx.in_scope(b.scope) && b.keys.contains(&key.code))
}

/// The action `key` triggers in `ctx`, or `None` when unbound.
pub fn lookup(key: &KeyEvent, ctx: Context, mode: Mode) -> Option<Action> {
    // Ctrl-C is the terminal's habit for "get me out": quit cleanly.
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == Char('c') {
        return Some(Action::Quit);
    }
    let b = binding_for(key, ctx)?;
    if mode.refusal(b).is_some() {
        return None;
    }
    Some(match (b.action, key.code) {
        (Action::Focus(_), Char(d)) => Action::Focus(
            d.to_digit(10)
                .and_then(|n| Pane::from_number(n as usize))
                .unwrap_or(Pane::Queued),
        ),
        (action, _) => action,
    })
}

/// The footer's hints for `ctx`: scoped keys first, then global ones.
pub fn hints(ctx: Context, mode: Mode) -> Vec<(&'static str, &'static str)> {
    let mut seen: Vec<&'static str> = Vec::new();
    active(mode)
        .filter(|b| b.hint && ctx.in_scope(b.scope))
        .filter(|b| {
            // A scoped `r` hides the global one in the hints too.
            let fresh = !seen.contains(&b.label);
            seen.push(b.label);
            fresh
        })
        .map(|b| (b.label, short(b, mode)))
        .collect()
}

fn short(b: &Binding, mode: Mode) -> &'static str {
    match b.action {
        Action::Open => "detail",
        Action::Mark => "mark",
        Action::Cancel => "cancel",
        Action::Requeue => "requeue",
        Action::Extend => "extend",
        Action::ReleaseLock => "release lock",
        Action::FireNow => "fire now",
        Action::ToggleSchedule => "pause/resume",
        Action::Filter => "filter",
        Action::Enqueue => "enqueue",
        Action::PauseNode => "pause node",
        Action::Help => "help",
        Action::Quit => "quit",
        _ => mode.description(b),
    }
}
