//! `bench/floor_share.py` reads the full-run tables of a history file and
//! sets jobdeck and twice the fastest peer against the floor (the
//! contract's writes alone) of each run since session 22. Fed a small file
//! here, so every figure it prints is known.

use std::process::Output;

mod common;

fn run_on(text: &str) -> Output {
    common::bench_script_on("floor_share.py", "HISTORY.md", text)
}

const FLOOR: &str = "floor: bench/floor.sql, 1 client x 8 jobs";

fn section(heading: &str, rows: &[(&str, u32)]) -> String {
    format!(
        "### {heading}: `bench/run.sh` (20,000 jobs, concurrency 8, medians of 3 runs)\n\n{}\n",
        common::run_table(rows)
    )
}

#[test]
fn each_run_is_set_against_its_own_floor() {
    // 8,470 over 10,000 is 0.847, written 0.85: it counts at 0.85.
    let near = section(
        "Session 30",
        &[
            ("jobdeck, Postgres", 8_470),
            ("pgqueuer 1.6", 4_000),
            ("graphile-worker 0.18", 4_500),
            (FLOOR, 10_000),
        ],
    );
    let far = section(
        "Session 31's first run, at abc1234",
        &[
            ("jobdeck, Postgres", 6_000),
            ("pgqueuer 1.6", 3_000),
            (FLOOR, 10_000),
        ],
    );
    // Before session 22, and without a floor row: neither is counted.
    let early = section(
        "Session 21",
        &[
            ("jobdeck, Postgres", 9_900),
            ("pgqueuer 1.6", 3_000),
            (FLOOR, 10_000),
        ],
    );
    let no_floor = section(
        "Session 32",
        &[("jobdeck, Postgres", 9_000), ("pgqueuer 1.6", 3_000)],
    );
    let out = run_on(&format!("# History\n\n{near}{far}{early}{no_floor}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // graphile-worker is the fastest peer of the first: 2 × 4,500 over 10,000.
    let first = stdout
        .lines()
        .find(|l| l.starts_with("Session 30 "))
        .expect("session 30's line");
    assert!(first.ends_with("0.847x      0.900x"), "{first:?}");
    assert!(
        !stdout.contains("Session 21") && !stdout.contains("Session 32"),
        "{stdout}"
    );
    assert!(stdout.contains("\n2 runs since session 22;"), "{stdout}");
    assert!(stdout.contains("0.85 of the floor: 1 of 2"), "{stdout}");
    assert!(stdout.contains("0.90 of the floor: 0 of 2"), "{stdout}");
    assert!(stdout.contains("0.75 of the floor: 1 of 2"), "{stdout}");
    assert!(stdout.contains("(0.600x to 0.847x)"), "{stdout}");
}

#[test]
fn a_file_without_such_tables_is_an_error() {
    let out = run_on("# History\n\nNo runs yet.\n");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no full-run table with a floor row"),
        "{stderr}"
    );
}
