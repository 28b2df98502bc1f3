//! One queue for the writers of every jobdeck process on a database file.
//!
//! SQLite's busy handler is not a queue: a writer that finds the database
//! locked sleeps (up to 100 ms at a time) and tries again, while engines
//! that commit back to back take the lock again within microseconds of
//! releasing it. Under a few busy workers, a `jobdeck enqueue` from another
//! process lost every try for its whole busy timeout and failed with
//! "database is locked" (tests/engine/sqlite_load.rs). Before `BEGIN
//! IMMEDIATE`, every jobdeck writer therefore takes an exclusive `flock` on
//! a file beside the database: a waiter sleeps in the kernel and is woken
//! at the release, instead of polling. SQLite's own lock stays the rule;
//! this only orders jobdeck's writers (anything else still meets the busy
//! timeout). An `flock` belongs to the open file, which all of a process's
//! transactions share: it orders processes, not one process's own writers,
//! which the store's writer mutex and gate keep one at a time.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::store::{Result, StoreError};

/// The lock file of a database file.
#[derive(Debug, Clone)]
pub(super) struct WriteLock {
    file: Arc<File>,
}

/// This process's turn to write; released when dropped.
#[derive(Debug)]
pub(super) struct WriteTurn {
    file: Arc<File>,
}

impl Drop for WriteTurn {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

impl WriteLock {
    /// The lock beside `database`, or `None` for a database that has no
    /// file (in memory: only this process can reach it).
    pub(super) fn beside(database: &Path) -> Result<Option<WriteLock>> {
        if !database.is_file() {
            return Ok(None);
        }
        let path = lock_path(database);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                StoreError::Unreachable(format!(
                    "cannot open the lock file {}: {e}",
                    path.display()
                ))
            })?;
        Ok(Some(WriteLock {
            file: Arc::new(file),
        }))
    }

    /// Wait for this process's turn to write.
    pub(super) async fn turn(&self) -> Result<WriteTurn> {
        match self.file.try_lock() {
            Ok(()) => return Ok(self.held()),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(lock_error(e)),
        }
        // The blocking wait runs on its own thread. Its turn travels back
        // as a guard: if the caller gave up meanwhile, the guard is dropped
        // with the channel and the lock released, never leaked.
        let (sent, received) = oneshot::channel();
        let lock = self.clone();
        tokio::task::spawn_blocking(move || {
            let turn = lock.file.lock().map(|()| lock.held());
            let _ = sent.send(turn);
        });
        received
            .await
            .map_err(|_| StoreError::Database("the write lock's waiter stopped".into()))?
            .map_err(lock_error)
    }

    fn held(&self) -> WriteTurn {
        WriteTurn {
            file: self.file.clone(),
        }
    }
}

/// `jobs.db` → `jobs.db-writer`, like SQLite's own `-wal` and `-shm`.
fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push("-writer");
    PathBuf::from(name)
}

fn lock_error(e: std::io::Error) -> StoreError {
    StoreError::Database(format!("write lock: {e}"))
}
