//! Database URLs: which backend, and how to show one without its password.

use super::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn backend_of(url: &str) -> Result<Backend, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(StoreError::Invalid(format!(
            "unsupported database URL {:?}: expected sqlite://PATH or postgres://USER@HOST/DB",
            redact_url(url)
        )))
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`; also
/// blanks a `password=` query parameter.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                out.replace_range(rest_start + colon + 1..rest_start + at, "***");
            }
        }
    }
    if let Some(q) = out.find("password=") {
        let end = out[q..].find('&').map_or(out.len(), |i| q + i);
        out.replace_range(q + "password=".len()..end, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_blanked() {
        assert_eq!(
            redact_url("postgres://bob:s3cr@t@db:5432/x"),
            "postgres://bob:***@db:5432/x"
        );
        assert_eq!(redact_url("postgres://bob@db/x"), "postgres://bob@db/x");
        assert_eq!(
            redact_url("postgres://db/x?user=a&password=zz&sslmode=off"),
            "postgres://db/x?user=a&password=***&sslmode=off"
        );
        assert_eq!(redact_url("sqlite://jobdeck.db"), "sqlite://jobdeck.db");
    }
}
