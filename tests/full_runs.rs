//! `bench/full_runs.py` recomputes the counts BENCHMARKS.md quotes under
//! its table of every full run. Fed a small file here, so every count it
//! prints is known.

use std::process::Output;

mod common;

fn run_on(text: &str) -> Output {
    common::bench_script_on("full_runs.py", "BENCHMARKS.md", text)
}

const TABLE: &str = "\
### Every full run since session 22

| session, code | CPU | Postgres ÷ fastest peer (passes) | five passes after | 100 targets ÷ own, Postgres (passes) | SQLite jobs/s (100 targets ÷ own) |
| --- | --- | --- | --- | --- | --- |
| 1, aaaaaaa | AMD EPYC | **2.10×** (1.997, 2.10, 2.30) | – | 0.65× (0.60, 0.65, 0.70) | 9,500 (0.80×) |
| 1, aaaaaaa | AMD EPYC | 1.90× (1.90, 2.00, 1.80) | **2.05×** | 0.80× (0.80, 0.81, 0.79) | 12,000 (0.69×) |
| 2, bbbbbbb | Intel Xeon | **2.20×** (2.20, 2.25, 1.95) | 1.95× | 0.75× | 20,000 (0.75×) |

Over these runs...

| 3, ccccccc | a later table with rows of the same shape | 9.99× | – | 0.10× | 1 (0.10×) |
";

#[test]
fn counts_are_read_off_the_table_alone() {
    let out = run_on(TABLE);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("3 full runs\n"), "{stdout}");
    // 1.997 stays under the line; 2.00 is on it.
    assert!(
        stdout
            .contains("median 2.100x (1.90x to 2.20x); at 2x or more in 2 runs and 5 of 9 passes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("five passes after a run: 2 sessions, 1 at 2x or more (1.95x to 2.05x)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Postgres: median 0.75x, 2 of 3 at 0.7x or more"),
        "{stdout}"
    );
    assert!(
        stdout.contains("SQLite: median 0.75x, 2 of 3 at 0.7x or more"),
        "{stdout}"
    );
    assert!(
        stdout.contains("SQLite: 2 of 3 at 10,000 jobs/s or more"),
        "{stdout}"
    );
}

#[test]
fn a_file_without_the_table_is_an_error() {
    let out = run_on("# Benchmarks\n\nNo runs yet.\n");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no table under"), "{stderr}");
}
