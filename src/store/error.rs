use crate::job::Refused;

/// Store failures, each worded as one line for an operator. Database errors
/// never carry the connection URL, so no password can leak through them.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("job {0} not found")]
    NotFound(i64),
    #[error("{0}")]
    Refused(#[from] Refused),
    /// The job moved on (new token or state): the caller no longer owns it.
    #[error("job {0}: lease lost (the job was taken over, requeued or cancelled)")]
    LeaseLost(i64),
    #[error("{0}")]
    Invalid(String),
    #[error("database unreachable: {0}")]
    Unreachable(String),
    #[error(
        "the database schema is version {found}, newer than this jobdeck understands ({known}); upgrade jobdeck"
    )]
    SchemaTooNew { found: i64, known: i64 },
    #[error("database error: {0}")]
    Database(String),
}

impl StoreError {
    /// Errors after which a retry may succeed (lost connection, server
    /// restarting, lock timeouts); background loops back off and retry these.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unreachable(_) | StoreError::Database(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => StoreError::Unreachable(one_line(&e.to_string())),
            _ => StoreError::Database(one_line(&e.to_string())),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Database(one_line(&format!("migration failed: {e}")))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
