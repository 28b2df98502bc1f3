//! The file as written: every key optional where it has a default, spans
//! kept on values that are checked after deserialisation so their errors
//! can name the line.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{LockBusyPolicy, Overlap};
use crate::job::StalePolicy;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub database: RawDatabase,
    #[serde(default)]
    pub workers: RawWorkers,
    #[serde(default)]
    pub pipeline: Vec<Spanned<RawPipeline>>,
    #[serde(default)]
    pub schedule: Vec<Spanned<RawSchedule>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDatabase {
    pub url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkers {
    pub slots: Option<Spanned<i64>>,
    pub cycles_in_flight: Option<Spanned<i64>>,
    pub busy_poll: Option<Dur>,
    pub lease: Option<Spanned<Dur>>,
    pub poll: Option<Spanned<Dur>>,
    pub kill_grace: Option<Dur>,
    pub drain_grace: Option<Dur>,
    pub retention: Option<Dur>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipeline {
    pub name: Spanned<String>,
    pub max_attempts: Option<Spanned<i64>>,
    pub backoff: Option<Dur>,
    pub timeout: Option<Spanned<Dur>>,
    pub on_lock_busy: Option<LockBusyPolicy>,
    pub lock_wait: Option<Dur>,
    pub on_stale: Option<StalePolicy>,
    #[serde(default)]
    pub step: Vec<Spanned<RawStep>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStep {
    pub name: Spanned<String>,
    pub run: Option<Spanned<Vec<Spanned<String>>>>,
    pub cwd: Option<Spanned<PathBuf>>,
    pub env: Option<Spanned<BTreeMap<String, String>>>,
    pub timeout: Option<Spanned<Dur>>,
    pub builtin: Option<Spanned<String>>,
    pub duration: Option<Spanned<Dur>>,
    pub fail_probability: Option<Spanned<f64>>,
    pub probability: Option<Spanned<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSchedule {
    pub name: Spanned<String>,
    pub pipeline: Spanned<String>,
    pub target: Option<Spanned<String>>,
    pub args: Option<toml::Table>,
    pub cron: Spanned<String>,
    pub timezone: Option<Spanned<String>>,
    pub overlap: Option<Overlap>,
    pub enabled: Option<bool>,
}

/// A duration written as text: "30s", "200ms", "7d", "1h 30m".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Dur;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a duration string such as \"30s\", \"200ms\" or \"7d\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    // humantime's answer to "-5s" is "expected number at 0": say what is
    // actually wrong.
    if t.starts_with('-') {
        return Err(format!("duration {s:?} is negative"));
    }
    humantime::parse_duration(t).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("-5s").unwrap_err().contains("negative"));
        assert!(
            parse_duration("5 parsecs")
                .unwrap_err()
                .contains("unknown time unit")
        );
        assert!(parse_duration("30").unwrap_err().contains("unit needed"));
    }
}
