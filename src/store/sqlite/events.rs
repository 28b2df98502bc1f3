//! The history rows of a batch, written together: a cycle moves each of
//! its jobs once or twice, and one INSERT for all of them replaces one per
//! kind of move (each a statement through sqlx's connection thread).

use sqlx::SqliteConnection;

use crate::job::State;
use crate::store::{Result, StoreError};

/// Events recorded during one transaction, all at the same time and by the
/// same actor, written in the order they were pushed.
#[derive(Debug, Default)]
pub(super) struct Events(Vec<(i64, Option<&'static str>, &'static str, String)>);

impl Events {
    pub(super) fn with_capacity(n: usize) -> Self {
        Events(Vec::with_capacity(n))
    }

    pub(super) fn push(&mut self, job: i64, from: State, to: State, detail: String) {
        self.0.push((job, Some(from.as_str()), to.as_str(), detail));
    }

    /// What was pushed, as the JSON list [`insert_events`] reads.
    pub(super) fn to_json(&self) -> Result<String> {
        serde_json::to_string(&self.0)
            .map_err(|e| StoreError::Invalid(format!("bad event list: {e}")))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// Write what was pushed (one statement) and start over. A job's later
    /// moves written one by one must come after this, so that its history
    /// stays in order.
    pub(super) async fn write(
        &mut self,
        tx: &mut SqliteConnection,
        at: i64,
        actor: &str,
    ) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO job_events (job_id, at, from_state, to_state, actor, detail)
             SELECT value ->> 0, ?1, value ->> 1, value ->> 2, ?2, value ->> 3
             FROM json_each(?3) ORDER BY key",
        )
        .bind(at)
        .bind(actor)
        .bind(self.to_json()?)
        .execute(&mut *tx)
        .await?;
        self.clear();
        Ok(())
    }
}
