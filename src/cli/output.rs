//! How commands print: one JSON document with `--json`, else an aligned table.

use chrono::{DateTime, Utc};
use comfy_table::{ContentArrangement, Table, presets::NOTHING};
use serde::Serialize;

pub fn json<T: Serialize + ?Sized>(value: &T) {
    // Serialising our own plain data types cannot fail.
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("serialisable")
    );
}

/// An aligned, borderless table with a header row.
pub fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut t = Table::new();
    t.load_style(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| h.to_uppercase()));
    for row in rows {
        t.add_row(row);
    }
    // comfy-table pads every cell with one space on the left; trim it.
    for line in t.to_string().lines() {
        println!("{}", line.strip_prefix(' ').unwrap_or(line).trim_end());
    }
}

pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

pub fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(|v| v.to_string()).unwrap_or_default()
}

/// `+12s` / `-3m` relative to now, for due times and lease expiries.
pub fn relative(t: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(t) = t else { return String::new() };
    let secs = (t - now).num_seconds();
    let sign = if secs < 0 { "-" } else { "+" };
    let d = std::time::Duration::from_secs(secs.unsigned_abs());
    format!("{sign}{}", humantime::format_duration(d))
}
