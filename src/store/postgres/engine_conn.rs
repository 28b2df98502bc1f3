//! The engine's own connections for its cycles. sqlx's pool pings every
//! connection on its way back (a Sync round trip), and while that ping is
//! out the next acquire takes another idle connection: the cycles of one
//! node rotated over four backends, each woken twice per cycle, and the
//! server spent 1.3–1.5× the CPU per job it spends with the cycle on one
//! backend. Idle connections kept here, one per cycle in flight, keep each
//! cycle on a warm backend and one round trip.
//!
//! Their sessions carry the settings `jobdeck_cycle` sets for itself, for
//! the lean cycle's plain statement (`lean_cycle`): it counts its own
//! moves, so the count trigger steps aside (`jobdeck.cycle_counts`; the
//! statement refuses to run on a session without it); every statement
//! sent here does, and the cycles that do not (those with a failure) run
//! on pooled connections. Plans stay generic (with array
//! and LIMIT parameters a custom plan always looks cheaper, and planning
//! at every call was a third of the server's time) and on the indexes (a
//! generic plan made while a table was small would otherwise keep a scan
//! of all of it), without JIT.

use std::sync::Mutex;

use sqlx::{Connection, PgConnection, PgPool};

use crate::store::{Result, StoreError};

/// Connections opened on first use with the pool's options (so a test
/// schema's search_path carries over) and the settings above, and opened
/// again after a failure that may have broken one.
#[derive(Debug, Default)]
pub(super) struct EngineConn {
    idle: Mutex<Vec<PgConnection>>,
}

/// A connection, out of the idle list while in use: a caller that is
/// dropped mid-query (its future cancelled) drops the connection with it,
/// so a half-sent or half-read exchange is never reused.
pub(super) struct HeldConn<'a> {
    home: &'a EngineConn,
    conn: PgConnection,
}

impl EngineConn {
    pub(super) async fn hold(&self, pool: &PgPool) -> Result<HeldConn<'_>> {
        let idle = self.lock().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let mut conn = PgConnection::connect_with(&pool.connect_options()).await?;
                // Set by statement rather than as startup options, which a
                // pooler may drop without a word.
                sqlx::query(
                    "SELECT set_config('jobdeck.cycle_counts', 'on', false), \
                            set_config('plan_cache_mode', 'force_generic_plan', false), \
                            set_config('enable_seqscan', 'off', false), \
                            set_config('jit', 'off', false)",
                )
                .execute(&mut conn)
                .await?;
                conn
            }
        };
        Ok(HeldConn { home: self, conn })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PgConnection>> {
        // Each update is one push or pop: a panic elsewhere cannot leave
        // the list half-changed.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl HeldConn<'_> {
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    /// Put the connection back for the next cycle, unless the outcome says
    /// it may be broken (the server's own errors leave it usable).
    pub(super) fn release<T>(self, outcome: &Result<T>) {
        if !matches!(outcome, Err(StoreError::Unreachable(_))) {
            self.home.lock().push(self.conn);
        }
    }
}
