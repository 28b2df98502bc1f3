//! Short human forms of times for narrow table cells.

use chrono::{DateTime, Utc};

/// "850ms", "12s", "3m04s", "2h05m", "3d04h"; negative durations as "-12s".
pub fn short_duration(d: chrono::Duration) -> String {
    if d < chrono::Duration::zero() {
        return format!("-{}", short_duration(-d));
    }
    let ms = d.num_milliseconds();
    let s = d.num_seconds();
    match s {
        _ if ms < 1000 && ms > 0 && s == 0 => format!("{ms}ms"),
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

/// How long ago `t` was, as "12s ago"; "in 5s" when it lies ahead.
pub fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let d = now - t;
    if d < chrono::Duration::zero() {
        format!("in {}", short_duration(-d))
    } else {
        format!("{} ago", short_duration(d))
    }
}

/// The widest [`left`] answer ("expired 59m59s", "expired 457ms"): lease
/// columns are this wide, so a cut never turns milliseconds into minutes.
pub const LEFT_WIDTH: u16 = 14;

/// Time left until `t`: "12s", or "expired 3s" once past.
pub fn left(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let d = t - now;
    if d <= chrono::Duration::zero() {
        format!("expired {}", short_duration(-d))
    } else {
        short_duration(d)
    }
}

/// Cut `s` to `max` characters, marking the cut with "…".
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_short() {
        let d = chrono::Duration::milliseconds;
        assert_eq!(short_duration(d(0)), "0s");
        assert_eq!(short_duration(d(250)), "250ms");
        assert_eq!(short_duration(d(12_400)), "12s");
        assert_eq!(short_duration(d(184_000)), "3m04s");
        assert_eq!(short_duration(d(7_500_000)), "2h05m");
        assert_eq!(short_duration(d(-12_000)), "-12s");
        assert_eq!(short_duration(d(90_000_000)), "1d01h");
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abc", 4), "abc");
    }

    #[test]
    fn lease_left_fits_its_column() {
        let now = Utc::now();
        for ms in [
            -1,
            -457,
            -999,
            -12_000,
            -184_000,
            -3_599_000,
            -7_500_000,
            -90_000_000,
            12_000,
        ] {
            let text = left(now + chrono::Duration::milliseconds(ms), now);
            assert!(
                text.chars().count() <= LEFT_WIDTH as usize,
                "{text:?} is wider than {LEFT_WIDTH}"
            );
        }
        assert_eq!(
            left(now - chrono::Duration::milliseconds(457), now),
            "expired 457ms"
        );
    }
}
