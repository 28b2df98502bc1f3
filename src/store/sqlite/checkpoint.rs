//! WAL checkpoints off the writers' path. SQLite checkpoints in the commit
//! that crosses `wal_autocheckpoint` (1000 pages): that commit copies the
//! WAL's pages into the database file and waits for two fsyncs, several
//! milliseconds during which the write lock is free but the writer is not.
//! A busy engine crossed it every 60 cycles or so, about a tenth of its
//! time. The writing connection's commits therefore start a passive
//! checkpoint on a pooled connection (its own thread), at most every
//! `EVERY`, which copies whatever is committed while the next transactions
//! go on.
//!
//! Such a checkpoint never quite catches up with a writer that keeps
//! committing, and SQLite reuses the WAL from its start only after a
//! checkpoint that copied all of it: the writing connection still
//! checkpoints itself, but past `WRITER_AUTOCHECKPOINT` pages, when most
//! of them have been copied already. That bounds the WAL (about 40 MB).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::SqlitePool;

/// The writing connection's own `wal_autocheckpoint`, in pages (ten times
/// SQLite's default): where it checkpoints in its commit and so lets the
/// next transaction reuse the WAL. It is also the only checkpoint of a
/// process that exits before a started one ran (`jobdeck enqueue`).
pub(super) const WRITER_AUTOCHECKPOINT: &str = "10000";

/// How often a writer's commit may start a checkpoint: at the engine's
/// pace, a couple of thousand pages each.
const EVERY: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub(super) struct Checkpoints {
    pool: SqlitePool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last: Instant,
    running: bool,
}

impl Checkpoints {
    pub(super) fn new(pool: SqlitePool) -> Arc<Self> {
        Arc::new(Checkpoints {
            pool,
            state: Mutex::new(State {
                last: Instant::now(),
                running: false,
            }),
        })
    }

    /// A commit on the writing connection: start a checkpoint unless one
    /// runs or the last is recent.
    pub(super) fn after_commit(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.running || s.last.elapsed() < EVERY {
                return;
            }
            s.running = true;
        }
        let this = self.clone();
        rt.spawn(async move {
            // PASSIVE never waits for readers or writers; what it cannot
            // copy now, the next one will.
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&this.pool)
                .await
            {
                tracing::debug!("WAL checkpoint: {e}");
            }
            let mut s = this.state.lock().unwrap_or_else(|p| p.into_inner());
            s.running = false;
            s.last = Instant::now();
        });
    }
}
