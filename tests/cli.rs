//! The scriptable CLI end to end: the built binary, its JSON on stdout and
//! its exit codes. The listing and operator commands run on SQLite and on
//! Postgres (where a one-shot command's pool holds one connection); the
//! rest on a temp SQLite file (the store itself is covered on both
//! backends by the contract suite).

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{jobdeck_in, stdout_json};

fn jobdeck(dir: &Path, args: &[&str]) -> Output {
    jobdeck_in(dir)
        .env("USER", "alice")
        .args(args)
        .output()
        .expect("run jobdeck")
}

/// Run, expect success, parse stdout as JSON.
fn json(dir: &Path, args: &[&str]) -> Value {
    stdout_json(jobdeck(dir, args), &format!("{args:?}"))
}

/// Run, expect failure with exactly one line on stderr; return it.
fn fails(dir: &Path, args: &[&str]) -> String {
    let out = jobdeck(dir, args);
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert_eq!(
        err.lines().count(),
        1,
        "{args:?}: one line expected, got {err:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// The commands of one test, all on one database: a SQLite file in a temp
/// dir, or a fresh schema of the `JOBDECK_TEST_POSTGRES` database.
struct Cli {
    dir: tempfile::TempDir,
    db: String,
    schema: Option<String>,
}

impl Cli {
    fn sqlite() -> Cli {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("jobdeck.db").display());
        Cli {
            dir,
            db,
            schema: None,
        }
    }

    /// `None` when `JOBDECK_TEST_POSTGRES` is unset (CI sets it).
    fn postgres() -> Option<Cli> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (store, schema) = rt.block_on(common::postgres_store_named())?;
        Some(Cli {
            dir: tempfile::tempdir().unwrap(),
            db: store.display_url(),
            schema: Some(schema),
        })
    }

    fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["--db", self.db.as_str()];
        all.extend_from_slice(args);
        all
    }

    fn run(&self, args: &[&str]) -> Output {
        jobdeck(self.dir.path(), &self.args(args))
    }

    fn json(&self, args: &[&str]) -> Value {
        json(self.dir.path(), &self.args(args))
    }

    fn fails(&self, args: &[&str]) -> String {
        fails(self.dir.path(), &self.args(args))
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        if let Some(schema) = self.schema.take()
            && !std::thread::panicking()
        {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(common::drop_schema(&schema));
        }
    }
}

/// One test per backend running the same commands; on Postgres a one-shot
/// command's pool holds one connection, so a command that wanted two at
/// once would time out here.
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[test]
            fn sqlite() {
                super::$name(&super::Cli::sqlite());
            }

            #[test]
            fn postgres() {
                if let Some(cli) = super::Cli::postgres() {
                    super::$name(&cli);
                }
            }
        }
    };
}

on_both_backends!(enqueue_list_show_and_dedupe);
on_both_backends!(operator_actions_and_their_refusals);

fn enqueue_list_show_and_dedupe(c: &Cli) {
    let first = c.json(&[
        "enqueue",
        "sync",
        "--target",
        "a",
        "--arg",
        "dest=/x",
        "--priority",
        "5",
        "--json",
    ]);
    assert_eq!(first["deduplicated"], false);
    let id = first["id"].as_i64().unwrap();
    // Plain output is just the id.
    let plain = c.run(&["enqueue", "sync", "--unique-key", "k1"]);
    let keyed: i64 = String::from_utf8_lossy(&plain.stdout)
        .trim()
        .parse()
        .unwrap();
    let again = c.json(&["enqueue", "sync", "--unique-key", "k1", "--json"]);
    assert_eq!(
        (again["id"].as_i64(), again["deduplicated"].as_bool()),
        (Some(keyed), Some(true))
    );

    let jobs = c.json(&["jobs", "--state", "queued", "--json"]);
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), 2, "the deduplicated enqueue added no row");
    let job = jobs.iter().find(|j| j["id"] == id).unwrap();
    for field in [
        "id",
        "pipeline",
        "target",
        "args",
        "state",
        "priority",
        "due_at",
        "attempt",
        "max_attempts",
        "step",
        "lease_owner",
        "lease_token",
        "lease_expires_at",
        "lock_fence",
        "unique_key",
        "cancel_requested_at",
        "last_error",
        "created_at",
        "started_at",
        "finished_at",
    ] {
        assert!(job.get(field).is_some(), "job JSON lacks {field}");
    }
    assert_eq!(job["state"], "queued");
    assert_eq!(job["args"]["dest"], "/x");
    assert_eq!(job["priority"], 5);
    assert!(chrono::DateTime::parse_from_rfc3339(job["created_at"].as_str().unwrap()).is_ok());
    assert_eq!(
        c.json(&["jobs", "--limit", "1", "--json"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        c.json(&["jobs", "--target", "a", "--json"])
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let shown = c.json(&["show", &id.to_string(), "--json"]);
    assert_eq!(shown["job"]["id"], id);
    let events = shown["events"].as_array().unwrap();
    assert_eq!(events[0]["to"], "queued");
    assert_eq!(
        events[0]["actor"],
        format!("operator:alice@{}", jobdeck::job::hostname())
    );

    let stats = c.json(&["stats", "--json"]);
    assert_eq!(stats["queued"], 2);
    assert_eq!(stats["running"], 0);
    assert_eq!(c.json(&["locks", "--json"]), Value::Array(vec![]));
    assert_eq!(c.json(&["workers", "--json"]), Value::Array(vec![]));

    // A human table has a header and one line per job.
    let table = c.run(&["jobs"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.lines().next().unwrap().starts_with("ID"));
    assert_eq!(text.lines().count(), 3);
}

fn operator_actions_and_their_refusals(c: &Cli) {
    let id = c.json(&["enqueue", "sync", "--json"])["id"]
        .as_i64()
        .unwrap()
        .to_string();
    let requeue = c.fails(&["requeue", &id]);
    assert_eq!(
        requeue,
        format!("jobdeck: job {id} is queued: it is already queued")
    );
    let extend = c.fails(&["extend", &id, "--by", "30s"]);
    assert!(extend.contains("only leased and running jobs"), "{extend}");

    let cancelled = c.json(&["cancel", &id, "--json"]);
    assert_eq!(cancelled[0]["ok"], true);
    assert_eq!(
        c.json(&["show", &id, "--json"])["job"]["state"],
        "cancelled"
    );
    let twice = c.fails(&["cancel", &id]);
    assert!(twice.contains("already finished"), "{twice}");
    // Requeue of a cancelled job is allowed and recorded with the operator.
    assert_eq!(c.json(&["requeue", &id, "--json"])[0]["ok"], true);
    let shown = c.json(&["show", &id, "--json"]);
    assert_eq!(shown["job"]["state"], "queued");
    let last = shown["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["from"].as_str(), last["to"].as_str()),
        (Some("cancelled"), Some("queued"))
    );
    assert!(
        last["actor"]
            .as_str()
            .unwrap()
            .starts_with("operator:alice@")
    );

    // Several ids: each reported, the exit status says one failed.
    let out = c.run(&["cancel", &id, "999", "--json"]);
    assert!(!out.status.success());
    let results: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[1]["error"], "job 999 not found");

    assert_eq!(
        c.fails(&["show", "424242"]),
        "jobdeck: job 424242 not found"
    );
    let release = c.fails(&["release", "nothing-here"]);
    assert!(release.contains("not locked"), "{release}");
}

#[test]
fn migrate_creates_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let out = jobdeck(dir.path(), &["migrate"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("up to date"));
    assert!(
        dir.path().join("jobdeck.db").exists(),
        "default sqlite://jobdeck.db in the cwd"
    );
}

#[test]
fn processes_opening_a_fresh_database_together_all_succeed() {
    // Several rounds: the race (both migrate, one finds the other's table)
    // needs the processes to overlap, which a loaded machine makes likely
    // in some round, not in every one.
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let children: Vec<_> = (0..8)
            .map(|_| {
                jobdeck_in(dir.path())
                    .args(["migrate", "--db", "sqlite://fresh.db"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn jobdeck")
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let listed = json(dir.path(), &["--db", "sqlite://fresh.db", "jobs", "--json"]);
        assert_eq!(listed, serde_json::json!([]));
    }
}

#[test]
fn malformed_arguments_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let dur = jobdeck(d, &["enqueue", "sync", "--in", "5 parsecs"]);
    assert!(!dur.status.success());
    assert!(String::from_utf8_lossy(&dur.stderr).contains("invalid duration \"5 parsecs\""));
    let arg = jobdeck(d, &["enqueue", "sync", "--arg", "novalue"]);
    assert!(!arg.status.success());
    assert!(String::from_utf8_lossy(&arg.stderr).contains("expected KEY=VALUE"));
    // Nothing was enqueued by the refused commands.
    assert_eq!(json(d, &["stats", "--json"])["queued"], 0);

    // With a config, an unknown pipeline is refused; without one, accepted.
    std::fs::write(
        d.join("jobdeck.toml"),
        "[[pipeline]]\nname = \"sync\"\n[[pipeline.step]]\nname = \"s\"\nbuiltin = \"noop\"\n",
    )
    .unwrap();
    let unknown = fails(d, &["enqueue", "synk"]);
    assert!(
        unknown.contains("unknown pipeline \"synk\"") && unknown.contains("sync"),
        "{unknown}"
    );
    std::fs::write(d.join("jobdeck.toml"), "[[pipeline]\nname = 1\n").unwrap();
    let syntax = fails(d, &["jobs"]);
    assert!(syntax.contains("jobdeck.toml:1"), "{syntax}");
    std::fs::remove_file(d.join("jobdeck.toml")).unwrap();
    assert_eq!(
        json(d, &["enqueue", "anything", "--json"])["deduplicated"],
        false
    );
}

#[test]
fn wait_reports_the_outcome_by_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let id = json(d, &["enqueue", "sync", "--json"])["id"]
        .as_i64()
        .unwrap()
        .to_string();
    let out = jobdeck(d, &["wait", &id, "--timeout", "300ms"]);
    assert_eq!(out.status.code(), Some(124), "still queued: timeout");
    json(d, &["cancel", &id, "--json"]);
    assert_eq!(
        jobdeck(d, &["wait", &id]).status.code(),
        Some(1),
        "cancelled is not success"
    );
}

/// A log reader that goes away (`jobdeck worker 2>&1 | head`, a log
/// collector restarted) must not stop the engine. Every log line then fails
/// to write; tracing's own report of that failure went to `eprintln!`,
/// which panicked the thread that logged: sqlx's SQLite connection thread
/// (it logs each query at debug), after which the engine waited forever.
#[test]
fn a_closed_stderr_does_not_stop_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = jobdeck_in(dir.path())
        .env("JOBDECK_LOG", "debug")
        .args(["bench", "--jobs", "50", "--slots", "4"])
        .args(["--no-latency", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run jobdeck");
    // The reader goes away before the first line is written.
    drop(child.stderr.take());
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("jobdeck bench still running 90 s after its stderr closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "jobdeck bench: {status}, stdout {out:?}");
    let report: Value = serde_json::from_str(out.trim()).expect("one JSON report on stdout");
    assert_eq!(report["jobs"], 50);
    assert_eq!(report["backend"], "sqlite");
}

/// A listing piped into `head` ends quietly when `head` stops reading, as
/// `cat` would (killed by SIGPIPE), instead of panicking on its next print.
#[test]
fn a_listing_whose_reader_goes_away_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("q.db").display());
    // 400 queued jobs: a listing far longer than a pipe's buffer.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = jobdeck::store::connect(&db)
            .await
            .expect("open the database");
        let jobs = (0..400).map(|_| common::new_job("p", None)).collect();
        store.enqueue_many(jobs, "test").await.expect("enqueue");
    });
    let mut child = jobdeck_in(dir.path())
        .args(["--db", &db, "jobs", "--state", "queued"])
        .args(["--limit", "400", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run jobdeck jobs");
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // Dropped: the reader goes away after 16 bytes.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let sigpipe = nix::sys::signal::Signal::SIGPIPE as i32;
    assert_eq!(out.status.signal(), Some(sigpipe), "{:?}", out.status);
}
