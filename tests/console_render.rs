//! Snapshot tests of the console's screens, drawn from fixed data with a
//! fixed clock through ratatui's TestBackend.

use std::time::Duration;

use jobdeck::console::dialogs::{Confirm, Input, Overlay};
use jobdeck::console::fixture;
use jobdeck::console::render::{self, Theme, View};
use jobdeck::console::state::Flash;
use jobdeck::console::update::on_key;
use jobdeck::console::{App, Command, Pane, Snapshot};
use jobdeck::engine::EngineStatus;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::style::Color;

struct Screen {
    app: App,
    snap: Snapshot,
    engine: Option<EngineStatus>,
    theme: Theme,
    drain_left: Option<Duration>,
}

impl Screen {
    fn new() -> Screen {
        Screen {
            app: App::new(false),
            snap: fixture::snapshot(),
            engine: Some(fixture::engine()),
            theme: Theme { color: true },
            drain_left: None,
        }
    }

    fn draw(&self, w: u16, h: u16) -> Terminal<TestBackend> {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        let catalog = fixture::catalog();
        term.draw(|f| {
            render::draw(
                f,
                &View {
                    app: &self.app,
                    snap: &self.snap,
                    engine: self.engine.as_ref(),
                    node_id: fixture::NODE,
                    db: "postgres://jobdeck:***@db.internal/jobs",
                    catalog: &catalog,
                    theme: self.theme,
                    now: fixture::now(),
                    drain_left: self.drain_left,
                },
            )
        })
        .unwrap();
        term
    }

    fn text(&self, w: u16, h: u16) -> String {
        self.draw(w, h).backend().to_string()
    }
}

#[test]
fn main_screen_wide() {
    let mut s = Screen::new();
    s.app.focus(Pane::Running);
    s.app.select(Pane::Running, 1);
    s.app.marked.insert(7);
    s.app.flash = Some(Flash::ok("job 9 requeued"));
    insta::assert_snapshot!("main_120x32", s.text(120, 32));
}

#[test]
fn main_screen_narrow_shows_one_pane_with_tabs() {
    let mut s = Screen::new();
    s.app.focus(Pane::Queued);
    let text = s.text(80, 24);
    insta::assert_snapshot!("main_80x24", text);
    s.app.focus(Pane::Locks);
    insta::assert_snapshot!("locks_80x24", s.text(80, 24));
}

#[test]
fn detail_view() {
    let mut s = Screen::new();
    s.snap = fixture::with_detail(s.snap, 7);
    s.app.detail = Some(7);
    insta::assert_snapshot!("detail_120x32", s.text(120, 32));
}

#[test]
fn detail_events_scroll_with_the_list_keys() {
    let mut s = Screen::new();
    s.snap = fixture::with_detail(s.snap, 7);
    let events = &mut s.snap.detail.as_mut().unwrap().events;
    let claimed = events[1].clone();
    for n in 4..=40 {
        events.push(jobdeck::job::Event {
            id: n,
            detail: format!("renewed #{n}"),
            ..claimed.clone()
        });
    }
    s.app.detail = Some(7);
    let catalog = fixture::catalog();
    let press = |s: &mut Screen, code: KeyCode, times: usize| {
        for _ in 0..times {
            on_key(&mut s.app, &KeyEvent::from(code), &s.snap, &catalog);
        }
        s.text(120, 32)
    };

    // The newest events first, as a log is watched.
    let newest = s.text(120, 32);
    assert!(newest.contains("renewed #40") && !newest.contains("enqueued"));
    let oldest = press(&mut s, KeyCode::PageUp, 4);
    assert!(oldest.contains("enqueued") && !oldest.contains("renewed #40"));
    insta::assert_snapshot!("detail_events_scrolled_120x32", oldest);
    let down = press(&mut s, KeyCode::Char('j'), 15);
    // The 16th event selected, at the window's bottom edge.
    assert!(down.contains("renewed #16") && !down.contains("renewed #17"));
    assert!(!down.contains("enqueued"));
    let back = press(&mut s, KeyCode::Char('G'), 1);
    assert_eq!(back, newest, "G goes back to following the newest");
    // Two events on screen still get their scrollbar.
    let short = s.text(90, 12);
    assert!(short.lines().any(|l| l.ends_with("█\"")), "{short}");
}

#[test]
fn help_overlay_is_generated_from_the_key_map() {
    let mut s = Screen::new();
    s.app.overlay = Some(Overlay::Help);
    let text = s.text(120, 40);
    insta::assert_snapshot!("help_120x40", text);
    // Read-only: the mutating keys are gone from the help.
    s.app.readonly = true;
    let ro = s.text(120, 40);
    assert!(text.contains("cancel the marked"));
    assert!(!ro.contains("cancel the marked"));
    assert!(ro.contains("read-only"));
    // Locks and Schedules have only mutating keys, which read-only leaves
    // unbound: no section header may be left without keys under it.
    for screen in [&text, &ro] {
        let inner: Vec<&str> = screen.lines().filter_map(|l| l.split('│').nth(1)).collect();
        for (i, line) in inner.iter().enumerate() {
            if line.trim_end().ends_with(':') && !line.starts_with(' ') {
                let next = inner.get(i + 1).copied().unwrap_or("");
                assert!(
                    next.starts_with("  ") && !next.trim_start().starts_with("mouse"),
                    "empty help section {line:?}:\n{screen}"
                );
            }
        }
    }
}

#[test]
fn no_workers_console_offers_no_node_keys() {
    let mut s = Screen::new();
    let with_engine = s.text(120, 32);
    assert!(with_engine.contains("p pause node"));
    s.engine = None;
    s.app.engine = false;
    let footer = s.text(120, 32);
    assert!(!footer.contains("p pause node"), "{footer}");
    assert!(footer.contains("no workers (watching)"));
    s.app.overlay = Some(Overlay::Help);
    let help = s.text(120, 40);
    for gone in ["this node's claiming", "one more slot", "one slot less"] {
        assert!(!help.contains(gone), "{gone:?} in the help:\n{help}");
    }
    assert!(help.contains("keys that act on this node's engine are not bound"));
}

#[test]
fn no_workers_quit_keys_promise_no_drain() {
    let mut s = Screen::new();
    s.app.overlay = Some(Overlay::Help);
    let with_engine = s.text(120, 40);
    assert!(with_engine.contains("q      quit (drain this node's jobs)"));
    assert!(with_engine.contains("Q      quit now (stop this node's steps)"));
    s.engine = None;
    s.app.engine = false;
    let help = s.text(120, 40);
    // Without an engine both keys only leave: there is nothing to drain or
    // stop (run.rs exits at once on either).
    for promise in ["drain this node's jobs", "stop this node's steps"] {
        assert!(!help.contains(promise), "{promise:?} in the help:\n{help}");
    }
    let line = |key: &str| {
        help.lines()
            .filter_map(|l| l.split('│').nth(1))
            .find(|l| l.starts_with(&format!("  {key:<7}")))
            .map(|l| l[9..].trim_end().to_string())
    };
    assert_eq!(line("q").as_deref(), Some("quit"));
    assert_eq!(
        line("Q").as_deref(),
        Some("quit (as q: this node runs no steps to stop)")
    );
    s.app.overlay = None;
    assert!(s.text(120, 32).contains("q quit"));
}

#[test]
fn confirm_dialog() {
    let mut s = Screen::new();
    s.app.focus(Pane::Running);
    let command = Command::Cancel(vec![7]);
    s.app.overlay = Some(Overlay::Confirm(Confirm {
        question: command.question().unwrap(),
        command,
    }));
    insta::assert_snapshot!("confirm_120x32", s.text(120, 32));
}

#[test]
fn enqueue_dialog() {
    let mut s = Screen::new();
    s.app.overlay = Some(Overlay::Input(Input::enqueue("sync")));
    let text = s.text(80, 24);
    assert!(text.contains("Enqueue a job"));
    assert!(text.contains("pipeline: sync▏"));
}

#[test]
fn too_small_and_tiny_terminals_do_not_panic() {
    let s = Screen::new();
    insta::assert_snapshot!("too_small_30x8", s.text(30, 8));
    for (w, h) in [
        (1, 1),
        (2, 1),
        (1, 5),
        (39, 9),
        (40, 10),
        (100, 28),
        (99, 40),
    ] {
        let _ = s.text(w, h);
    }
}

#[test]
fn database_error_shows_in_header() {
    let mut s = Screen::new();
    s.snap.error = Some("database unreachable: connection refused".into());
    let text = s.text(120, 32);
    let header: Vec<&str> = text.lines().take(2).collect();
    assert!(header[1].contains("database unreachable: connection refused"));
    // The panes keep the last good rows.
    assert!(text.contains("dataset-stuck"));
}

#[test]
fn queued_rows_say_why_they_wait() {
    let text = Screen::new().text(120, 32);
    for why in [
        "blocked by #7",
        "retry in 12s",
        "due in 5s",
        "no live worker runs report",
        "ready",
    ] {
        assert!(text.contains(why), "missing {why:?}");
    }
}

#[test]
fn drain_shows_in_footer() {
    let mut s = Screen::new();
    s.app.draining = true;
    s.drain_left = Some(Duration::from_millis(3200));
    let text = s.text(120, 32);
    assert!(text.contains("draining: 1 running job(s) get 4s more"));
}

#[test]
fn colours_per_state_and_no_color() {
    let find = |term: &Terminal<TestBackend>, needle: &str| {
        let buf = term.backend().buffer();
        for y in 0..buf.area.height {
            let line: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect();
            if let Some(x) = line.find(needle) {
                // Byte offset equals column here: the fixture rows are ASCII
                // up to the needle.
                return buf[(x as u16, y)].fg;
            }
        }
        panic!("{needle:?} not on screen");
    };
    let mut s = Screen::new();
    let coloured = s.draw(120, 32);
    assert_eq!(find(&coloured, "retry in 12s"), Color::Red);
    assert_eq!(find(&coloured, "stale  "), Color::Red);
    s.theme = Theme { color: false };
    let plain = s.draw(120, 32);
    assert_eq!(find(&plain, "retry in 12s"), Color::Reset);
}
