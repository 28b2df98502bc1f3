//! Database retries for background loops and fenced writes: transient
//! errors (lost connection, server restarting, too many clients) are
//! retried with backoff and logged; nothing here ever gives up on them.

use std::future::Future;
use std::time::Duration;

use crate::store::{Result, StoreError};

pub const FIRST_DELAY: Duration = Duration::from_millis(100);
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// Exponential backoff between `FIRST_DELAY` and `MAX_DELAY`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST_DELAY }
    }
}

impl Backoff {
    pub fn reset(&mut self) {
        self.next = FIRST_DELAY;
    }
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(MAX_DELAY);
    }
}

/// Run `op` until it succeeds or fails for good. Returns the final result
/// and whether a transient error happened on the way (the write may then
/// have been committed by an attempt whose answer was lost).
pub async fn until_settled<T, F, Fut>(what: &str, mut op: F) -> (Result<T>, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut backoff = Backoff::default();
    let mut interrupted = false;
    loop {
        match op().await {
            Err(e) if e.is_transient() => {
                tracing::warn!("{what}: {e}; retrying");
                interrupted = true;
                backoff.wait().await;
            }
            other => return (other, interrupted),
        }
    }
}

/// True when the error says the caller no longer holds the job.
pub fn is_lost(r: &StoreError) -> bool {
    matches!(r, StoreError::LeaseLost(_))
}
