//! The key map as a table (key → action in each context), and what keys do
//! to the console's state against a fixed snapshot.

use jobdeck::console::dialogs::Overlay;
use jobdeck::console::fixture;
use jobdeck::console::keymap::{self, Action, Context, Mode};
use jobdeck::console::state::Flash;
use jobdeck::console::update::{Effect, on_key, on_mouse};
use jobdeck::console::{App, Command, Pane};
use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::Rect;

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn mouse(kind: MouseEventKind, column: u16, row: u16) -> MouseEvent {
    MouseEvent {
        kind,
        column,
        row,
        modifiers: KeyModifiers::NONE,
    }
}

fn ch(c: char) -> KeyEvent {
    let mods = if c.is_ascii_uppercase() {
        KeyModifiers::SHIFT
    } else {
        KeyModifiers::NONE
    };
    KeyEvent::new(KeyCode::Char(c), mods)
}

/// The usual console: every key bound.
const OPERATOR: Mode = Mode {
    readonly: false,
    engine: true,
};
const READONLY: Mode = Mode {
    readonly: true,
    engine: true,
};
const NO_WORKERS: Mode = Mode {
    readonly: false,
    engine: false,
};

fn ctx(pane: Pane) -> Context {
    Context {
        pane,
        detail: false,
    }
}

#[test]
fn key_to_action_table() {
    use Action as A;
    use KeyCode::*;
    let detail = Context {
        pane: Pane::Locks,
        detail: true,
    };
    let cases: &[(KeyEvent, Context, Option<Action>)] = &[
        (key(Tab), ctx(Pane::Queued), Some(A::FocusNext)),
        (key(BackTab), ctx(Pane::Queued), Some(A::FocusPrev)),
        (ch('1'), ctx(Pane::Locks), Some(A::Focus(Pane::Queued))),
        (ch('5'), ctx(Pane::Queued), Some(A::Focus(Pane::Locks))),
        (ch('8'), ctx(Pane::Queued), Some(A::Focus(Pane::Schedules))),
        (ch('9'), ctx(Pane::Queued), None),
        (ch('j'), ctx(Pane::Queued), Some(A::Down)),
        (key(Down), ctx(Pane::Queued), Some(A::Down)),
        (ch('k'), ctx(Pane::Queued), Some(A::Up)),
        (key(Up), ctx(Pane::Queued), Some(A::Up)),
        (key(PageDown), ctx(Pane::Queued), Some(A::PageDown)),
        (key(PageUp), ctx(Pane::Queued), Some(A::PageUp)),
        (ch('g'), ctx(Pane::Queued), Some(A::Top)),
        (ch('G'), ctx(Pane::Queued), Some(A::Bottom)),
        (key(Enter), ctx(Pane::Running), Some(A::Open)),
        (key(Enter), ctx(Pane::Workers), None),
        // The detail view is already open: Enter has nothing to open.
        (key(Enter), detail, None),
        (key(Esc), ctx(Pane::Queued), Some(A::Back)),
        (ch(' '), ctx(Pane::Stale), Some(A::Mark)),
        (ch(' '), detail, None),
        (ch('c'), ctx(Pane::Running), Some(A::Cancel)),
        (ch('c'), detail, Some(A::Cancel)),
        (ch('c'), ctx(Pane::Workers), None),
        (ch('r'), ctx(Pane::Stale), Some(A::Requeue)),
        (ch('r'), ctx(Pane::Finished), Some(A::Requeue)),
        (ch('r'), ctx(Pane::Schedules), Some(A::FireNow)),
        (ch('s'), ctx(Pane::Schedules), Some(A::ToggleSchedule)),
        (ch('s'), ctx(Pane::Queued), None),
        (ch('e'), ctx(Pane::Running), Some(A::Extend)),
        (ch('E'), ctx(Pane::Running), Some(A::ExtendBy)),
        (ch('x'), ctx(Pane::Locks), Some(A::ReleaseLock)),
        (ch('x'), ctx(Pane::Running), None),
        (ch('x'), detail, None),
        (ch('/'), ctx(Pane::Queued), Some(A::Filter)),
        (ch('/'), ctx(Pane::Locks), Some(A::Filter)),
        (ch('/'), detail, None),
        (ch('n'), ctx(Pane::Locks), Some(A::Enqueue)),
        (ch('p'), ctx(Pane::Queued), Some(A::PauseNode)),
        (ch('+'), ctx(Pane::Queued), Some(A::SlotsUp)),
        (ch('-'), ctx(Pane::Queued), Some(A::SlotsDown)),
        (ch('?'), ctx(Pane::Queued), Some(A::Help)),
        (ch('q'), ctx(Pane::Queued), Some(A::Quit)),
        (ch('Q'), ctx(Pane::Queued), Some(A::QuitNow)),
        (
            KeyEvent::new(Char('c'), KeyModifiers::CONTROL),
            ctx(Pane::Running),
            Some(A::Quit),
        ),
        (
            KeyEvent::new(Char('r'), KeyModifiers::CONTROL),
            ctx(Pane::Stale),
            None,
        ),
    ];
    for (k, c, want) in cases {
        assert_eq!(keymap::lookup(k, *c, OPERATOR), *want, "{k:?} in {c:?}");
    }
}

#[test]
fn readonly_leaves_mutating_keys_unbound() {
    for b in keymap::BINDINGS {
        for code in b.keys {
            let k = key(*code);
            let c = match b.scope {
                keymap::Scope::Locks => ctx(Pane::Locks),
                keymap::Scope::Schedules => ctx(Pane::Schedules),
                _ => ctx(Pane::Running),
            };
            let got = keymap::lookup(&k, c, READONLY);
            if b.mutating {
                assert_eq!(got, None, "{} is bound in read-only", b.label);
            } else {
                assert!(got.is_some(), "{} lost in read-only", b.label);
            }
        }
    }
    // What changes anything is flagged so.
    for a in ["c", "r", "e", "E", "x", "s", "n", "p", "+", "-"] {
        assert!(
            keymap::BINDINGS
                .iter()
                .filter(|b| b.label == a)
                .all(|b| b.mutating),
            "{a} must be flagged mutating"
        );
    }
    let hints = keymap::hints(ctx(Pane::Running), READONLY);
    assert!(hints.iter().all(|(k, _)| !["c", "r", "e", "p"].contains(k)));
    assert!(hints.iter().any(|(k, _)| *k == "q"));
}

#[test]
fn footer_hints_follow_the_focused_pane() {
    let labels = |p| {
        keymap::hints(ctx(p), OPERATOR)
            .into_iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
    };
    assert!(labels(Pane::Schedules).contains(&"r fire now".to_string()));
    assert!(!labels(Pane::Schedules).contains(&"r requeue".to_string()));
    assert!(labels(Pane::Stale).contains(&"r requeue".to_string()));
    assert!(labels(Pane::Locks).contains(&"x release lock".to_string()));
    assert!(!labels(Pane::Queued).contains(&"x release lock".to_string()));
    let detail = Context {
        pane: Pane::Running,
        detail: true,
    };
    let in_detail = keymap::hints(detail, OPERATOR);
    assert!(
        in_detail.iter().all(|(k, _)| *k != "Enter"),
        "Enter offered in the detail view: {in_detail:?}"
    );
    assert!(in_detail.iter().any(|(k, _)| *k == "c"));
}

#[test]
fn without_workers_the_node_keys_are_unbound_and_say_why() {
    let labels = |mode| -> Vec<&str> {
        keymap::hints(ctx(Pane::Queued), mode)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    assert!(labels(OPERATOR).contains(&"p"));
    assert!(
        !labels(NO_WORKERS).contains(&"p"),
        "{:?}",
        labels(NO_WORKERS)
    );
    assert!(labels(NO_WORKERS).contains(&"c"), "only the node's keys go");
    for c in ['p', '+', '-'] {
        assert_eq!(keymap::lookup(&ch(c), ctx(Pane::Queued), NO_WORKERS), None);
        assert!(keymap::active(NO_WORKERS).all(|b| !b.keys.contains(&KeyCode::Char(c))));
    }

    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    assert_eq!(
        on_key(&mut app, &ch('p'), &snap, &cat),
        Effect::Run(Command::ToggleNodePause)
    );
    app.engine = false;
    assert_eq!(on_key(&mut app, &ch('p'), &snap, &cat), Effect::None);
    let flash = app
        .flash
        .clone()
        .expect("a pressed p says why nothing happens");
    assert!(flash.error);
    assert_eq!(
        flash.text,
        "this console runs no workers (--no-workers): p (pause/resume this node's claiming) is disabled"
    );
}

#[test]
fn space_and_slash_are_unbound_in_the_detail_view() {
    let detail = Context {
        pane: Pane::Running,
        detail: true,
    };
    for c in [' ', '/'] {
        assert_eq!(keymap::lookup(&ch(c), detail, OPERATOR), None, "{c:?}");
    }
    let hints = keymap::hints(detail, OPERATOR);
    assert!(
        hints.iter().all(|(k, _)| !["Space", "/"].contains(k)),
        "list keys offered in the detail view: {hints:?}"
    );
    // The filter is still there for every pane, not only the job panes.
    for p in Pane::ALL {
        assert_eq!(
            keymap::lookup(&ch('/'), ctx(p), OPERATOR),
            Some(Action::Filter)
        );
    }

    let snap = fixture::with_detail(fixture::snapshot(), 7);
    let cat = fixture::catalog();
    let mut app = App::new(false);
    app.focus(Pane::Running);
    on_key(&mut app, &key(KeyCode::Enter), &snap, &cat);
    assert_eq!(app.detail, Some(7));
    let before = app.clone();
    for c in [' ', '/'] {
        assert_eq!(on_key(&mut app, &ch(c), &snap, &cat), Effect::None);
        assert_eq!(app, before, "{c:?} acted behind the detail view");
    }
}

#[test]
fn cancel_asks_then_runs_on_yes() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    app.focus(Pane::Running);
    assert_eq!(on_key(&mut app, &ch('c'), &snap, &cat), Effect::None);
    assert!(matches!(&app.overlay, Some(Overlay::Confirm(c)) if c.question == "Cancel job 7?"));
    // Any other key leaves the question open; n dismisses it.
    assert_eq!(on_key(&mut app, &ch('x'), &snap, &cat), Effect::None);
    assert!(app.overlay.is_some());
    assert_eq!(on_key(&mut app, &ch('n'), &snap, &cat), Effect::None);
    assert!(app.overlay.is_none());
    on_key(&mut app, &ch('c'), &snap, &cat);
    assert_eq!(
        on_key(&mut app, &ch('y'), &snap, &cat),
        Effect::Run(Command::Cancel(vec![7]))
    );
}

#[test]
fn the_next_action_clears_an_old_flash() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    app.focus(Pane::Running);
    app.flash = Some(Flash::ok("job 9 requeued"));
    on_key(&mut app, &ch('c'), &snap, &cat);
    assert!(matches!(app.overlay, Some(Overlay::Confirm(_))));
    assert_eq!(app.flash, None, "the dialog opened under an old result");
    on_key(&mut app, &ch('n'), &snap, &cat);

    app.flash = Some(Flash::err("nothing selected"));
    on_key(&mut app, &ch('j'), &snap, &cat);
    assert_eq!(app.flash, None, "moving on leaves the old error behind");

    // A key bound to nothing is no action: the flash stays to be read.
    app.flash = Some(Flash::ok("job 9 requeued"));
    on_key(&mut app, &ch('z'), &snap, &cat);
    assert_eq!(app.flash, Some(Flash::ok("job 9 requeued")));
}

#[test]
fn marked_rows_are_the_targets() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    // Queued pane: mark rows 0 and 2 (Space moves down).
    on_key(&mut app, &ch(' '), &snap, &cat);
    on_key(&mut app, &ch('j'), &snap, &cat);
    on_key(&mut app, &ch(' '), &snap, &cat);
    assert_eq!(app.marked.iter().copied().collect::<Vec<_>>(), vec![11, 13]);
    on_key(&mut app, &ch('c'), &snap, &cat);
    assert_eq!(
        on_key(&mut app, &key(KeyCode::Enter), &snap, &cat),
        Effect::Run(Command::Cancel(vec![11, 13]))
    );
    assert!(app.marked.is_empty(), "marks are spent by the action");
}

#[test]
fn extend_uses_the_pipelines_lease_and_typed_durations() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    app.focus(Pane::Stale);
    // Job 5's pipeline has a 6 s lease.
    assert_eq!(
        on_key(&mut app, &ch('e'), &snap, &cat),
        Effect::Run(Command::Extend {
            ids: vec![5],
            by: std::time::Duration::from_secs(6)
        })
    );
    on_key(&mut app, &ch('E'), &snap, &cat);
    for c in "90s".chars() {
        on_key(&mut app, &ch(c), &snap, &cat);
    }
    assert_eq!(
        on_key(&mut app, &key(KeyCode::Enter), &snap, &cat),
        Effect::Run(Command::Extend {
            ids: vec![5],
            by: std::time::Duration::from_secs(90)
        })
    );
}

#[test]
fn release_lock_refuses_running_holders_without_asking() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    app.focus(Pane::Locks);
    on_key(&mut app, &ch('x'), &snap, &cat);
    assert!(app.overlay.is_none());
    let flash = app.flash.clone().unwrap();
    assert!(flash.error);
    assert_eq!(
        flash.text,
        "job 7 is running: only a stale job's lock can be released by hand"
    );
    // The stale holder's lock: asked, then released.
    on_key(&mut app, &ch('G'), &snap, &cat);
    on_key(&mut app, &ch('x'), &snap, &cat);
    assert!(matches!(&app.overlay, Some(Overlay::Confirm(_))));
    assert_eq!(
        on_key(&mut app, &ch('y'), &snap, &cat),
        Effect::Run(Command::ReleaseLock("dataset-stuck".into()))
    );
}

#[test]
fn schedules_fire_and_pause() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    on_key(&mut app, &ch('8'), &snap, &cat);
    assert_eq!(app.focus, Pane::Schedules);
    assert_eq!(app.side, Pane::Schedules);
    assert_eq!(
        on_key(&mut app, &ch('r'), &snap, &cat),
        Effect::Run(Command::FireNow {
            id: 1,
            name: "nightly-sync".into()
        })
    );
    assert_eq!(
        on_key(&mut app, &ch('s'), &snap, &cat),
        Effect::Run(Command::SetSchedulePaused {
            name: "nightly-sync".into(),
            paused: true
        })
    );
}

#[test]
fn navigation_detail_and_back() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(false);
    on_key(&mut app, &key(KeyCode::Tab), &snap, &cat);
    on_key(&mut app, &key(KeyCode::Tab), &snap, &cat);
    assert_eq!(app.focus, Pane::Running);
    on_key(&mut app, &ch('G'), &snap, &cat);
    on_key(&mut app, &ch('j'), &snap, &cat);
    assert_eq!(app.selected_row(Pane::Running, &snap), Some(1));
    on_key(&mut app, &key(KeyCode::Enter), &snap, &cat);
    assert_eq!(app.detail, Some(8));
    on_key(&mut app, &key(KeyCode::Esc), &snap, &cat);
    assert_eq!(app.detail, None);
    on_key(&mut app, &key(KeyCode::BackTab), &snap, &cat);
    assert_eq!(app.focus, Pane::Leased);
    // Filter: typed text replaces the filter; Esc clears it.
    on_key(&mut app, &ch('/'), &snap, &cat);
    for c in "stuck".chars() {
        on_key(&mut app, &ch(c), &snap, &cat);
    }
    on_key(&mut app, &key(KeyCode::Enter), &snap, &cat);
    assert_eq!(app.filter, "stuck");
    on_key(&mut app, &key(KeyCode::Esc), &snap, &cat);
    assert_eq!(app.filter, "");
}

#[test]
fn readonly_key_explains_itself() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(true);
    app.focus(Pane::Running);
    assert_eq!(on_key(&mut app, &ch('c'), &snap, &cat), Effect::None);
    assert!(app.overlay.is_none());
    assert!(app.flash.unwrap().text.starts_with("read-only console"));
}

#[test]
fn quit_keys() {
    let snap = fixture::snapshot();
    let cat = fixture::catalog();
    let mut app = App::new(true);
    assert_eq!(on_key(&mut app, &ch('q'), &snap, &cat), Effect::Quit);
    assert_eq!(on_key(&mut app, &ch('Q'), &snap, &cat), Effect::QuitNow);
    // q inside the help only closes the help.
    app.overlay = Some(Overlay::Help);
    assert_eq!(on_key(&mut app, &ch('q'), &snap, &cat), Effect::None);
    assert!(app.overlay.is_none());
}

#[test]
fn mouse_hits_map_to_panes_rows_and_tabs() {
    use jobdeck::console::render::{self, job_rows, tab_at};
    use ratatui::layout::Rect;
    let snap = fixture::snapshot();
    let app = App::new(false);
    let wide = render::layout(Rect::new(0, 0, 120, 32), &app, job_rows(&snap));
    // Header (2 lines), Queued title, column header, then job 11, 12, 13.
    assert_eq!(wide.hit(10, 6, &app), Some((Pane::Queued, Some(2))));
    assert_eq!(wide.hit(10, 3, &app), Some((Pane::Queued, None)));
    let locks = wide
        .panes
        .iter()
        .find(|(p, _)| *p == Pane::Locks)
        .unwrap()
        .1;
    assert_eq!(
        wide.hit(locks.x + 1, locks.y + 2, &app),
        Some((Pane::Locks, Some(0)))
    );
    assert_eq!(wide.hit(10, 31, &app), None, "the footer is no pane");

    let narrow = render::layout(Rect::new(0, 0, 80, 24), &app, job_rows(&snap));
    assert!(narrow.tabs.is_some());
    assert_eq!(narrow.panes.len(), 1);
    // "1 Queued│2 Leased│3 Running│…"
    assert_eq!(tab_at(0), Some(Pane::Queued));
    assert_eq!(tab_at(9), Some(Pane::Leased));
    assert_eq!(tab_at(18), Some(Pane::Running));
    assert_eq!(tab_at(200), None);
}

#[test]
fn a_click_or_wheel_clears_an_old_flash_as_a_key_does() {
    use MouseEventKind::{Down, Moved, ScrollDown, ScrollUp};
    let snap = fixture::with_detail(fixture::snapshot(), 7);
    let wide = Rect::new(0, 0, 120, 32);
    let old = || Some(Flash::ok("job 9 requeued"));
    let mut app = App::new(false);

    // Queued row 2 of the wide layout (see mouse_hits_map_to_panes_rows_and_tabs).
    app.flash = old();
    on_mouse(
        &mut app,
        &mouse(Down(MouseButton::Left), 10, 6),
        wide,
        &snap,
    );
    assert_eq!(app.selected_row(Pane::Queued, &snap), Some(2));
    assert_eq!(app.flash, None, "the click left the old result up");

    app.flash = old();
    on_mouse(&mut app, &mouse(ScrollUp, 10, 6), wide, &snap);
    assert_eq!(app.selected_row(Pane::Queued, &snap), Some(0));
    assert_eq!(app.flash, None, "the wheel left the old result up");

    // Tabs of the narrow layout, and the detail view's events.
    app.flash = old();
    on_mouse(
        &mut app,
        &mouse(Down(MouseButton::Left), 9, 2),
        Rect::new(0, 0, 80, 24),
        &snap,
    );
    assert_eq!(app.focus, Pane::Leased);
    assert_eq!(app.flash, None, "the tab click left the old result up");
    app.open_detail(Some(7));
    app.flash = old();
    on_mouse(&mut app, &mouse(ScrollUp, 10, 10), wide, &snap);
    assert_eq!(app.detail_event, Some(0));
    assert_eq!(app.flash, None, "the detail's wheel left the old result up");
    app.detail = None;

    // What does nothing is no action, as an unbound key: the flash stays.
    let before = {
        app.flash = old();
        app.clone()
    };
    for (m, area) in [
        (mouse(Moved, 10, 6), wide),
        (mouse(Down(MouseButton::Right), 10, 6), wide),
        (mouse(Down(MouseButton::Left), 10, 31), wide),
        (mouse(ScrollDown, 10, 6), Rect::new(0, 0, 30, 8)),
    ] {
        on_mouse(&mut app, &m, area, &snap);
        assert_eq!(app, before, "{m:?} at {area:?}");
    }
    app.overlay = Some(Overlay::Help);
    on_mouse(
        &mut app,
        &mouse(Down(MouseButton::Left), 10, 6),
        wide,
        &snap,
    );
    assert_eq!(app.flash, old(), "the help swallows the click");
}
