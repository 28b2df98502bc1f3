//! Fuzzing the console's key handling (proptest, bounded): random key
//! sequences applied to `App` over the fixture snapshot, with a draw after
//! every key at a random terminal size (1×1 included), never panic.

use jobdeck::console::render::{self, Theme, View};
use jobdeck::console::update::on_key;
use jobdeck::console::{App, fixture};
use proptest::prelude::*;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

fn code() -> impl Strategy<Value = KeyCode> {
    prop_oneof![
        // The keys the console binds, most of the time…
        4 => prop::sample::select(
            "jkgGcrRexXlLpPsSfF/?qQ yYnN12345678hH0-=+:".chars().collect::<Vec<_>>()
        )
        .prop_map(KeyCode::Char),
        // …and anything else.
        1 => any::<char>().prop_map(KeyCode::Char),
        2 => prop::sample::select(vec![
            KeyCode::Enter,
            KeyCode::Esc,
            KeyCode::Tab,
            KeyCode::BackTab,
            KeyCode::Up,
            KeyCode::Down,
            KeyCode::Left,
            KeyCode::Right,
            KeyCode::PageUp,
            KeyCode::PageDown,
            KeyCode::Home,
            KeyCode::End,
            KeyCode::Backspace,
            KeyCode::Delete,
            KeyCode::Insert,
            KeyCode::Null,
        ]),
        1 => (0u8..=24).prop_map(KeyCode::F),
    ]
}

fn key() -> impl Strategy<Value = KeyEvent> {
    let mods = prop::sample::select(vec![
        KeyModifiers::NONE,
        KeyModifiers::NONE,
        KeyModifiers::NONE,
        KeyModifiers::SHIFT,
        KeyModifiers::CONTROL,
        KeyModifiers::ALT,
        KeyModifiers::CONTROL | KeyModifiers::SHIFT,
    ]);
    (code(), mods).prop_map(|(c, m)| KeyEvent::new(c, m))
}

fn size() -> impl Strategy<Value = (u16, u16)> {
    prop_oneof![Just((1, 1)), (1u16..20, 1u16..10), (20u16..130, 10u16..45),]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_keys_never_panic(
        readonly in any::<bool>(),
        detail in any::<bool>(),
        steps in prop::collection::vec((key(), size()), 1..30),
    ) {
        let snap = if detail {
            fixture::with_detail(fixture::snapshot(), 7)
        } else {
            fixture::snapshot()
        };
        let catalog = fixture::catalog();
        let engine = fixture::engine();
        let mut app = App::new(readonly);
        for (key, (w, h)) in &steps {
            on_key(&mut app, key, &snap, &catalog);
            let mut term = Terminal::new(TestBackend::new(*w, *h)).expect("terminal");
            term.draw(|f| {
                render::draw(
                    f,
                    &View {
                        app: &app,
                        snap: &snap,
                        engine: Some(&engine),
                        node_id: fixture::NODE,
                        db: "postgres://jobdeck:***@db/jobs",
                        catalog: &catalog,
                        theme: Theme { color: true },
                        now: fixture::now(),
                        drain_left: None,
                    },
                )
            })
            .expect("draw");
        }
    }
}
