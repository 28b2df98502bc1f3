//! The engine's own connection for its cycle. sqlx's pool pings every
//! connection on its way back (a Sync round trip), and while that ping is
//! out the next acquire takes another idle connection: the cycles of one
//! node rotated over four backends, each woken twice per cycle, and the
//! server spent 1.3–1.5× the CPU per job it spends with the cycle on one
//! backend. One connection behind a mutex keeps the cycle on one warm
//! backend and one round trip.

use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{Mutex, MutexGuard};

use crate::store::{Result, StoreError};

/// A connection opened on first use with the pool's options (so a test
/// schema's search_path carries over), and opened again after a failure
/// that may have broken it.
#[derive(Debug, Default)]
pub(super) struct EngineConn {
    slot: Mutex<Option<PgConnection>>,
}

/// The connection, out of its slot while in use: a caller that is dropped
/// mid-query (its future cancelled) drops the connection with it, so a
/// half-sent or half-read exchange is never reused.
pub(super) struct HeldConn<'a> {
    slot: MutexGuard<'a, Option<PgConnection>>,
    conn: PgConnection,
}

impl EngineConn {
    pub(super) async fn hold(&self, pool: &PgPool) -> Result<HeldConn<'_>> {
        let mut slot = self.slot.lock().await;
        let conn = match slot.take() {
            Some(conn) => conn,
            None => PgConnection::connect_with(&pool.connect_options()).await?,
        };
        Ok(HeldConn { slot, conn })
    }
}

impl HeldConn<'_> {
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    /// Put the connection back for the next cycle, unless the outcome says
    /// it may be broken (the server's own errors leave it usable).
    pub(super) fn release<T>(mut self, outcome: &Result<T>) {
        if !matches!(outcome, Err(StoreError::Unreachable(_))) {
            *self.slot = Some(self.conn);
        }
    }
}
