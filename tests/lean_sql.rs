//! `bench/lean_sql.py floor BATCH` prints the floor for `bench/lean.sh`
//! and `bench/server_instructions.sh`. It must be the statement
//! `bench/run.sh`'s floor rows send, with the batch a literal: a `LIMIT`
//! sent as a parameter gets another plan under the server's default
//! settings (session 50: 396,980 server instructions per job against
//! 261,636), which once made the floor look costlier than jobdeck's cycle.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn lean_sql(args: &[&str]) -> Output {
    Command::new("python3")
        .arg(repo_file("bench/lean_sql.py"))
        .args(args)
        .output()
        .expect("python3 runs bench/lean_sql.py")
}

#[test]
fn the_floor_is_run_sh_s_statement_with_its_batch_a_literal() {
    let out = lean_sql(&["floor", "8"]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // run.sh: sed "s/LIMIT BATCH/LIMIT $batch/" on floor.sql, on jobs of
    // the pipeline 'noop'; lean.sh queues its jobs under 'bench'.
    let floor =
        std::fs::read_to_string(repo_file("bench/floor.sql")).expect("read bench/floor.sql");
    let as_run_sh_sends_it = floor
        .replace("LIMIT BATCH", "LIMIT 8")
        .replace("pipeline = 'noop'", "pipeline = 'bench'");
    assert_eq!(printed.trim_end(), as_run_sh_sends_it.trim_end());
    assert!(!printed.contains(":batch"), "{printed}");
}

#[test]
fn the_floor_without_a_batch_is_refused_with_its_usage() {
    for args in [&["floor"][..], &["floor", "0"], &["floor", ":batch"]] {
        let out = lean_sql(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(out.stdout.is_empty(), "{args:?} printed a statement");
        assert!(err.contains("usage: lean_sql.py floor BATCH"), "{err}");
    }
}

#[test]
fn the_cycle_statement_keeps_its_batch_a_parameter_as_the_engine_sends_it() {
    let out = lean_sql(&[]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed.contains("LIMIT :batch"), "{printed}");
}
