//! Cron patterns and time zones of `[[schedule]]`.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// Six fields (with seconds) or five (seconds = 0); a seventh "year" field
/// is refused so that six fields can only mean seconds.
pub(super) fn parse_cron(pattern: &str) -> Result<Cron, String> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(pattern)
        .map_err(|e| {
            let e = e.to_string();
            let e = e.strip_prefix("Invalid pattern: ").unwrap_or(&e);
            format!("invalid cron {pattern:?}: {e}")
        })
}

pub(super) fn parse_timezone(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>().map_err(|_| {
        format!(
            "unknown time zone {name:?} (expected an IANA name such as \"UTC\" or \"Europe/Paris\")"
        )
    })
}

pub(super) fn next_fire_after(
    pattern: &str,
    timezone: &str,
    t: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let cron = parse_cron(pattern).ok()?;
    let tz = parse_timezone(timezone).ok()?;
    cron.find_next_occurrence(&t.with_timezone(&tz), false)
        .ok()
        .map(|next| next.with_timezone(&Utc))
}
