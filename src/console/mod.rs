//! The live operations console: a ratatui TUI over the store and this
//! node's engine handle.
//!
//! Kept apart so each piece can be tested alone: `snapshot` fetches what the
//! panes show (on background tasks), `state` holds what the operator did
//! (focus, selection, marks, dialogs), `keymap` is the one table of keys,
//! `update` turns keys into state changes and [`Command`]s, `actions` runs
//! commands against the store, and `render` only draws.

pub mod actions;
pub mod catalog;
pub mod dialogs;
#[doc(hidden)]
pub mod fixture;
pub mod fmt;
pub mod keymap;
pub mod render;
mod run;
pub mod snapshot;
pub mod state;
pub mod update;

pub use actions::Command;
pub use catalog::Catalog;
pub use run::{ConsoleOptions, run};
pub use snapshot::Snapshot;
pub use state::{App, Pane};
