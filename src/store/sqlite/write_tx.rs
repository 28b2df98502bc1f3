//! A writing transaction: `BEGIN IMMEDIATE` … `COMMIT` on a connection
//! this process holds, with its place among the writers held until it
//! ends.
//!
//! The transaction is plain SQL rather than sqlx's `Transaction`, whose
//! only owned form comes from a pool: a pooled connection goes back to its
//! pool through a spawned task that first pings it, one more hand-off to
//! the connection's thread after every commit. The queued writers' one
//! connection is held behind a mutex instead, so a transaction costs its
//! statements and nothing else. Plain SQL also lets a caller send `BEGIN`
//! or `COMMIT` in the same query as its own statements.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection};
use tokio::sync::{OwnedMutexGuard, OwnedRwLockReadGuard, OwnedRwLockWriteGuard};

use super::checkpoint::Checkpoints;
use super::write_lock::WriteTurn;
use crate::store::Result;

/// The connection a transaction runs on.
pub(super) enum Held {
    /// The queued writers' connection.
    Writer(OwnedMutexGuard<SqliteConnection>),
    Pooled(PoolConnection<Sqlite>),
}

/// How a transaction passed the gate (held until it ends).
pub(super) enum Gate {
    Shared(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Alone(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

/// Everything a transaction holds until it ends. Dropped in field order:
/// the connection (so no other writer of this process can use it while
/// it is still in the transaction), then the gate, then the turn among
/// processes.
struct Place {
    conn: Held,
    _gate: Gate,
    _turn: Option<WriteTurn>,
}

/// A `BEGIN IMMEDIATE` transaction. Dropped without [`WriteTx::commit`],
/// it is rolled back before its connection and its place are given up.
pub(super) struct WriteTx {
    place: Option<Place>,
    /// Whether a `BEGIN` was sent, so that a drop has something to roll
    /// back.
    begun: bool,
    /// Set on the writing connection, which leaves checkpoints to these.
    checkpoints: Option<Arc<Checkpoints>>,
}

impl WriteTx {
    /// Open a transaction on `conn`.
    pub(super) async fn begin(
        conn: Held,
        gate: Gate,
        turn: Option<WriteTurn>,
        checkpoints: Option<Arc<Checkpoints>>,
    ) -> Result<WriteTx> {
        let mut tx = WriteTx::opened(conn, gate, turn, checkpoints);
        // A BEGIN that failed opened nothing: `begun` stays unset.
        sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *tx).await?;
        tx.begun = true;
        Ok(tx)
    }

    /// A transaction whose `BEGIN IMMEDIATE` goes with the caller's first
    /// query (see [`Unbegun::begin_with`]).
    pub(super) fn unbegun(
        conn: Held,
        gate: Gate,
        turn: Option<WriteTurn>,
        checkpoints: Option<Arc<Checkpoints>>,
    ) -> Unbegun {
        Unbegun(WriteTx::opened(conn, gate, turn, checkpoints))
    }

    fn opened(
        conn: Held,
        gate: Gate,
        turn: Option<WriteTurn>,
        checkpoints: Option<Arc<Checkpoints>>,
    ) -> WriteTx {
        WriteTx {
            place: Some(Place {
                conn,
                _gate: gate,
                _turn: turn,
            }),
            begun: false,
            checkpoints,
        }
    }

    pub(super) async fn commit(mut self) -> Result<()> {
        sqlx::raw_sql("COMMIT").execute(&mut *self).await?;
        self.committed();
        Ok(())
    }

    /// The transaction's last query, ending in `COMMIT`, ran without an
    /// error.
    pub(super) fn committed(mut self) {
        // Nothing to roll back: give the place up now.
        self.place = None;
        if let Some(c) = &self.checkpoints {
            c.after_commit();
        }
    }
}

/// A writing transaction whose `BEGIN IMMEDIATE` is not sent yet: it goes
/// as the first statement of the first query, one round trip through the
/// connection's thread less.
pub(super) struct Unbegun(WriteTx);

impl Unbegun {
    /// `sql` preceded by `BEGIN IMMEDIATE`, and the transaction it opens.
    /// The query's first statement result is the `BEGIN`'s.
    pub(super) fn begin_with(self, sql: &str) -> (WriteTx, AssertSqlSafe<String>) {
        let Unbegun(mut tx) = self;
        // Whether the BEGIN will run is known only after the query: a
        // rollback that finds no transaction fails harmlessly.
        tx.begun = true;
        (tx, AssertSqlSafe(format!("BEGIN IMMEDIATE;\n{sql}")))
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        let Some(mut place) = self.place.take() else {
            return;
        };
        if !self.begun {
            return;
        }
        // The rollback needs the connection's thread; the place is held
        // until it is done. Without a runtime the process is ending, and
        // closing the connection ends the transaction.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = sqlx::raw_sql("ROLLBACK").execute(place.conn.as_mut()).await {
                    tracing::debug!("rollback: {e}");
                }
                drop(place);
            });
        }
    }
}

impl Held {
    fn as_mut(&mut self) -> &mut SqliteConnection {
        match self {
            Held::Writer(c) => c,
            Held::Pooled(c) => c,
        }
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        match &self
            .place
            .as_ref()
            .expect("a transaction in use is open")
            .conn
        {
            Held::Writer(c) => c,
            Held::Pooled(c) => c,
        }
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.place
            .as_mut()
            .expect("a transaction in use is open")
            .conn
            .as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::super::SqliteStore;

    async fn store(dir: &tempfile::TempDir) -> SqliteStore {
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = SqliteStore::connect(&url).await.unwrap();
        sqlx::raw_sql("CREATE TABLE t (x INTEGER)")
            .execute(store.pool())
            .await
            .unwrap();
        store
    }

    async fn rows(store: &SqliteStore) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_dropped_transaction_is_rolled_back_before_the_next_writer_runs() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let mut tx = store.begin().await.unwrap();
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        drop(tx);
        // Still inside the first transaction, this BEGIN would fail.
        let mut tx = store.begin().await.unwrap();
        sqlx::query("INSERT INTO t VALUES (2)")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let kept: Vec<i64> = sqlx::query_scalar("SELECT x FROM t")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(kept, vec![2]);
    }

    #[tokio::test]
    async fn a_first_query_that_fails_after_its_begin_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let unbegun = store.begin_in_first_query().await.unwrap();
        let (mut tx, sql) = unbegun.begin_with("INSERT INTO t VALUES (1); SELECT * FROM missing");
        assert!(sqlx::raw_sql(sql).execute(&mut *tx).await.is_err());
        drop(tx);
        let (mut tx, sql) = store
            .begin_in_first_query()
            .await
            .unwrap()
            .begin_with("INSERT INTO t VALUES (2)");
        sqlx::raw_sql(sql).execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&store).await, 1);
    }

    #[tokio::test]
    async fn a_last_query_commits_with_its_statements_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let mut tx = store.begin().await.unwrap();
        let sql = "INSERT INTO t VALUES (1); SELECT * FROM missing; COMMIT";
        assert!(sqlx::raw_sql(sql).execute(&mut *tx).await.is_err());
        drop(tx);
        assert_eq!(rows(&store).await, 0);
        let mut tx = store.begin().await.unwrap();
        let sql = "INSERT INTO t VALUES (1); COMMIT";
        sqlx::raw_sql(sql).execute(&mut *tx).await.unwrap();
        tx.committed();
        // Committed: another connection sees it, and the writer is free.
        assert_eq!(rows(&store).await, 1);
        store.begin().await.unwrap().commit().await.unwrap();
    }
}
