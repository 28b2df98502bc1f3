//! Wake-ups across processes on SQLite, which has no NOTIFY: a connection's
//! `PRAGMA data_version` changes when any other connection (another
//! process, or this one's writer) commits. Checking it is a read of a
//! counter in shared memory, so it can run every few milliseconds where a
//! claim per poll could not; the engine's poll stays the backstop.
//!
//! Any commit wakes the claim loop, not only an enqueue: a wake-up with
//! nothing to claim costs one empty claim, and a busy engine, whose slots
//! are full, does not claim on a wake-up at all.

use std::str::FromStr;
use std::time::Duration;

use futures::StreamExt;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};

use crate::store::{Notice, NoticeStream, Result, StoreError};

/// How often the counter is read: the delay a job enqueued by another
/// process waits at most before this node claims it.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(20);

/// A stream that yields `JobsAvailable` after each change another
/// connection committed, on its own connection (its counter is per
/// connection, and it must not hold one of the pool's).
pub(super) async fn changes(url: &str) -> Result<NoticeStream> {
    let opts = SqliteConnectOptions::from_str(url)
        .map_err(|e| StoreError::Invalid(format!("bad SQLite URL {url:?}: {e}")))?;
    let mut conn = SqliteConnection::connect_with(&opts).await?;
    let seen = data_version(&mut conn).await?;
    let stream = futures::stream::unfold((conn, seen), |(mut conn, seen)| async move {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            match data_version(&mut conn).await {
                Ok(now) if now != seen => return Some((Ok(Notice::JobsAvailable), (conn, now))),
                Ok(_) => {}
                Err(e) => return Some((Err(e), (conn, seen))),
            }
        }
    });
    Ok(stream.boxed())
}

async fn data_version(conn: &mut SqliteConnection) -> Result<i64> {
    Ok(sqlx::query_scalar("PRAGMA data_version")
        .fetch_one(conn)
        .await?)
}
