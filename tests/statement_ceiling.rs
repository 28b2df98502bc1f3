//! `bench/statement_ceiling.py` reads the full-run tables of a history
//! file and sets jobdeck and its cycle statement alone (the lean row)
//! against the fastest peer of each run. Fed a small file here, so every
//! figure it prints is known.

use std::process::Output;

mod common;

fn run_on(text: &str) -> Output {
    common::bench_script_on("statement_ceiling.py", "HISTORY.md", text)
}

const LEAN: &str = "lean: jobdeck's cycle statement, 1 x 8 jobs";

#[test]
fn each_run_is_set_against_its_own_fastest_peer() {
    let counted = common::run_table(&[
        ("jobdeck, Postgres", 12_000),
        ("pgqueuer 1.6", 5_000),
        ("graphile-worker 0.18", 6_000),
        (LEAN, 13_200),
    ]);
    // At 16 slots, and without a lean row: neither is counted.
    let at_16 = common::run_table(&[
        ("jobdeck, Postgres", 20_000),
        ("pgqueuer 1.6", 5_000),
        (LEAN, 30_000),
    ]);
    let no_lean = common::run_table(&[("jobdeck, Postgres", 9_000), ("pgqueuer 1.6", 5_000)]);
    let text = format!(
        "# History\n\n### Run A: `bench/run.sh` (20,000 jobs, concurrency 8, medians of 3 runs)\n\n{counted}\n\
         ### Run B: `bench/run.sh --concurrency 16` (20,000 jobs, concurrency 16, medians of 3 runs)\n\n{at_16}\n\
         ### Run C: `bench/run.sh` (20,000 jobs, concurrency 8, medians of 3 runs)\n\n{no_lean}\n"
    );
    let out = run_on(&text);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // graphile-worker is the fastest peer: 12,000 and 13,200 over 6,000.
    let run_a = stdout
        .lines()
        .find(|l| l.starts_with("Run A"))
        .expect("Run A's line");
    assert!(
        run_a.ends_with("2.000x     2.200x        0.909x"),
        "{run_a:?}"
    );
    assert!(
        !stdout.contains("Run B") && !stdout.contains("Run C"),
        "{stdout}"
    );
    assert!(stdout.contains("\n1 runs;"), "{stdout}");
    // 2.2 × 0.90 is under the line, × 0.93 over it.
    assert!(
        stdout.contains("0.900 of the statement: 0 of 1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("0.930 of the statement: 1 of 1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("jobdeck at or over 2x in 1 of 1"),
        "{stdout}"
    );
}

#[test]
fn a_file_without_such_tables_is_an_error() {
    let out = run_on("# History\n\nNo runs yet.\n");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no full-run table with a lean row"),
        "{stderr}"
    );
}
