//! WAL checkpoints off the writers' path. SQLite checkpoints in the commit
//! that crosses `wal_autocheckpoint` (1000 pages): that commit copies the
//! WAL's pages into the database file and waits for two fsyncs, several
//! milliseconds during which the write lock is free but the writer is not.
//! A busy engine crossed it every 60 cycles or so, about a tenth of its
//! time. The writing connection therefore checkpoints only past a much
//! larger WAL; its commits start a passive checkpoint on a pooled
//! connection instead (its own thread), at most every `EVERY`, which
//! copies whatever is committed while the next transactions go on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::SqlitePool;

/// The writing connection's own `wal_autocheckpoint`, in pages: a safety
/// net for processes whose commits never get to start a checkpoint (a
/// `jobdeck enqueue` exits first), far above what the checkpoints started
/// below leave in the WAL of a busy engine (about 2,000 pages).
pub(super) const WRITER_AUTOCHECKPOINT: &str = "10000";

/// How often a writer's commit may start a checkpoint. At the engine's
/// pace this keeps the WAL within a few thousand pages; a WAL that every
/// reader has moved past is reused from its start by the next writer.
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
