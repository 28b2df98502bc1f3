//! Bad input, each answered by one clear line and a non-zero exit, never a
//! panic: broken configs (with file:line and the key), wrong database URLs,
//! a schema from the future, out-of-range arguments; and at run time, a
//! missing binary, shell metacharacters, huge and binary output. The
//! database password never shows, in errors, logs or `--json` output.

mod common;

#[path = "engine/harness/mod.rs"]
mod harness;

#[path = "faults/cluster.rs"]
#[allow(dead_code)]
mod cluster;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use harness::{Env, Kind, eventually};
use jobdeck::job::State;

const PASSWORD: &str = "s3cret-Pa55word";

fn jobdeck(dir: &Path, args: &[&str]) -> Output {
    common::jobdeck_in(dir)
        .args(args)
        .output()
        .expect("run jobdeck")
}

/// Exit non-zero with exactly one line on stderr, no panic; returns it.
fn one_line_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected a failure, got: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, got: {stderr}");
    lines[0].to_string()
}

fn config_error(toml: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("bad.toml"), toml).expect("write config");
    let db = format!("sqlite://{}", dir.path().join("x.db").display());
    one_line_error(&jobdeck(
        dir.path(),
        &["--db", &db, "--config", "bad.toml", "jobs"],
    ))
}

const PIPELINE: &str =
    "[[pipeline]]\nname = \"p\"\n[[pipeline.step]]\nname = \"s\"\nbuiltin = \"noop\"\n";

#[test]
fn config_errors_name_file_line_and_key() {
    let cases: &[(&str, String, &[&str])] = &[
        (
            "unknown pipeline in a schedule",
            format!(
                "{PIPELINE}[[schedule]]\nname = \"x\"\npipeline = \"nope\"\ncron = \"* * * * * *\"\n"
            ),
            &["bad.toml:8:", "pipeline", "nope"],
        ),
        (
            "bad cron",
            format!(
                "{PIPELINE}[[schedule]]\nname = \"x\"\npipeline = \"p\"\ncron = \"61 * * * * *\"\n"
            ),
            &["bad.toml:9:", "cron", "61 * * * * *"],
        ),
        (
            "empty step list",
            "[[pipeline]]\nname = \"p\"\n".to_string(),
            &["bad.toml:1:", "pipeline \"p\"", "no steps"],
        ),
        (
            "unknown key",
            "[workers]\nslots = 2\nbogus = 1\n".to_string(),
            &["bad.toml:3:", "bogus"],
        ),
        (
            "negative duration",
            "[workers]\nlease = \"-5s\"\n".to_string(),
            &["bad.toml:2:", "lease", "negative"],
        ),
        (
            "negative step timeout",
            format!("{PIPELINE}timeout = \"-1m\"\n"),
            &["bad.toml:6:", "timeout", "negative"],
        ),
    ];
    for (what, toml, wants) in cases {
        let line = config_error(toml);
        for want in *wants {
            assert!(
                line.contains(want),
                "{what}: {want:?} missing from {line:?}"
            );
        }
    }
}

#[test]
fn cli_arguments_out_of_range() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = format!("sqlite://{}", dir.path().join("x.db").display());
    for (args, flag) in [
        (vec!["jobs", "--limit", "0"], "--limit"),
        (
            vec!["enqueue", "p", "--max-attempts", "0"],
            "--max-attempts",
        ),
        (vec!["worker", "--slots", "0"], "--slots"),
        (vec!["console", "--slots", "0"], "--slots"),
    ] {
        let mut all = vec!["--db", &db];
        all.extend(args.iter().copied());
        let out = jobdeck(dir.path(), &all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // clap's usage error: the problem on the first line, then a hint.
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: invalid value '0'") && first.contains(flag),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn wrong_scheme_and_closed_port_say_so_without_the_password() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = cluster::free_port();
    let closed = format!("postgres://u:{PASSWORD}@127.0.0.1:{port}/db");
    let scheme = format!("mysql://u:{PASSWORD}@127.0.0.1/db");
    for (url, want) in [
        (scheme.as_str(), "unsupported database URL"),
        (closed.as_str(), "database unreachable"),
    ] {
        for args in [
            &["jobs", "--json"][..],
            &["worker"][..],
            &["stats", "--json"][..],
        ] {
            let mut all = vec!["--db", url];
            all.extend(args);
            let out = jobdeck(dir.path(), &all);
            let line = one_line_error(&out);
            assert!(line.contains(want), "{args:?}: {line}");
            assert!(!line.contains(PASSWORD), "password shown: {line}");
            assert!(out.stdout.is_empty(), "{args:?}: output on stdout");
        }
    }
}

#[tokio::test]
async fn schema_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = format!("sqlite://{}", dir.path().join("x.db").display());
    drop(
        jobdeck::store::connect(&db)
            .await
            .expect("create the database"),
    );
    let pool = sqlx::SqlitePool::connect(&db).await.expect("open");
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .execute(&pool)
    .await
    .expect("fake a newer migration");
    pool.close().await;
    for args in [&["jobs"][..], &["worker"][..], &["migrate"][..]] {
        let mut all = vec!["--db", db.as_str()];
        all.extend(args);
        let line = one_line_error(&jobdeck(dir.path(), &all));
        assert!(
            line.contains("9999") && line.contains("newer"),
            "{args:?}: {line}"
        );
    }
}

/// Opening a database that holds all of this binary's migrations skips
/// the migrator; an edited or a failed migration must still stop every
/// command with one line, as the migrator does, on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edited_or_failed_migrations_are_still_refused() {
    let (sqlite, _dir) = common::sqlite_store().await;
    refuses_edited_or_failed_migrations(&sqlite).await;
    if let Some((postgres, schema)) = common::postgres_store_named().await {
        refuses_edited_or_failed_migrations(&postgres).await;
        common::drop_schema(&schema).await;
    }
}

async fn refuses_edited_or_failed_migrations(store: &jobdeck::store::Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = store.display_url();
    let stats = || jobdeck(dir.path(), &["--db", &url, "stats", "--json"]);
    assert!(stats().status.success(), "a migrated database opens");

    common::raw_exec(
        store,
        "UPDATE _sqlx_migrations SET success = false WHERE version = 2".into(),
    )
    .await;
    let line = one_line_error(&stats());
    assert!(line.contains("2 is partially applied"), "{line}");

    common::raw_exec(
        store,
        "UPDATE _sqlx_migrations SET success = true, checksum = substr(checksum, 2) \
         WHERE version = 2"
            .into(),
    )
    .await;
    let line = one_line_error(&stats());
    assert!(
        line.contains("2 was previously applied but has been modified"),
        "{line}"
    );
}

/// A cluster of the test's own that asks for a password (the machine's
/// server trusts every local login, so a wrong password would pass there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_one_line_and_secrets_never_show() {
    let Some(cluster) = cluster::Cluster::start_auth(Some(PASSWORD)) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let wrong = cluster.url_with_password("not-the-password");
    let line = one_line_error(&jobdeck(dir.path(), &["--db", &wrong, "jobs"]));
    assert!(line.contains("password"), "the cause is named: {line}");
    assert!(!line.contains("not-the-password"), "password shown: {line}");

    // With the right one: a worker's log and every --json output stay clean.
    let url = cluster.url_with_password(PASSWORD);
    std::fs::write(
        dir.path().join("jobdeck.toml"),
        format!("{PIPELINE}[workers]\nlease = \"2s\"\n"),
    )
    .expect("config");
    let out = jobdeck(dir.path(), &["--db", &url, "enqueue", "p", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let worker = jobdeck(
        dir.path(),
        &["--db", &url, "worker", "--exit-when-idle", "--no-scheduler"],
    );
    let log = String::from_utf8_lossy(&worker.stderr);
    assert!(worker.status.success(), "{log}");
    assert!(!log.contains(PASSWORD), "password in the worker log: {log}");
    for args in [
        &["jobs", "--json"][..],
        &["show", "1", "--json"][..],
        &["workers", "--json"][..],
        &["stats", "--json"][..],
        &["locks", "--json"][..],
        &["schedules", "--json"][..],
    ] {
        let mut all = vec!["--db", url.as_str()];
        all.extend(args);
        let out = jobdeck(dir.path(), &all);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            !text.contains(PASSWORD),
            "{args:?} shows the password: {text}"
        );
    }
}

const STEPS: &str = r#"
[workers]
lease = "3s"
kill_grace = "500ms"

[[pipeline]]
name = "missing"
max_attempts = 1
[[pipeline.step]]
name = "run"
run = ["/nonexistent/jobdeck-no-such-binary", "x"]

[[pipeline]]
name = "argv"
max_attempts = 1
[[pipeline.step]]
name = "print"
run = ["/usr/bin/printf", "[%s]\n", "{target}", "{arg.x}"]

[[pipeline]]
name = "noisy"
max_attempts = 1
[[pipeline.step]]
name = "huge"
run = ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo; head -c 200000 /dev/urandom; echo; echo last-line"]
"#;

/// Shell metacharacters that would create files if any shell read them.
const NASTY_TARGET: &str = "t;touch pwned1;$(touch pwned2)`touch pwned3`";
const NASTY_ARG: &str = "a b|touch pwned4 && touch pwned5 > x 'q\" *";

async fn show_output(env: &Env, id: i64) -> String {
    let v = env.cli_json(&["show", &id.to_string()]).await;
    v["output"].as_str().unwrap_or_default().to_string()
}

async fn steps_meet_bad_input(env: Env) {
    let config = env.config("steps.toml", STEPS);
    let worker = env.worker(&config, &["--slots", "2", "--no-scheduler"]);
    // One attempt: the store does not stamp the pipeline's max_attempts.
    let job = jobdeck::store::NewJob {
        pipeline: "missing".into(),
        max_attempts: Some(1),
        ..Default::default()
    };
    let missing = env
        .store
        .enqueue(job, "operator:test@host")
        .await
        .expect("enqueue")
        .id;
    let job = env
        .wait_state(missing, State::Failed, Duration::from_secs(20))
        .await;
    assert_eq!(job.attempt, 1);
    let error = job.last_error.unwrap_or_default();
    assert!(
        error.contains("/nonexistent/jobdeck-no-such-binary") && error.lines().count() == 1,
        "the error names the binary: {error:?}"
    );
    assert!(harness::alive(worker.pid), "the worker lives on");

    // Each nasty string arrives as one argv item; no shell ran it.
    let argv = env
        .enqueue("argv", Some(NASTY_TARGET), &[("x", NASTY_ARG)])
        .await;
    env.wait_state(argv, State::Succeeded, Duration::from_secs(20))
        .await;
    let out = show_output(&env, argv).await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&format!("[{NASTY_TARGET}]").as_str())
            && lines.contains(&format!("[{NASTY_ARG}]").as_str()),
        "argv items: {out:?}"
    );
    for n in 1..=5 {
        for dir in [
            env.dir.path().to_path_buf(),
            std::env::current_dir().unwrap(),
        ] {
            assert!(
                !dir.join(format!("pwned{n}")).exists(),
                "a shell ran pwned{n}"
            );
        }
    }

    // 3 MB in one line and 200 kB of random bytes: the job succeeds, the
    // worker lives, the tail that every console reads stays bounded.
    let noisy = env.enqueue("noisy", None, &[]).await;
    env.wait_state(noisy, State::Succeeded, Duration::from_secs(30))
        .await;
    let tail = show_output(&env, noisy).await;
    assert!(tail.len() < 512 * 1024, "tail of {} bytes", tail.len());
    assert!(
        tail.lines().count() <= 200,
        "{} lines",
        tail.lines().count()
    );
    assert!(
        tail.lines().all(|l| l.len() <= 2048 + 64),
        "a line over the cap"
    );
    assert!(tail.contains("last-line"), "the end of the output is kept");
    assert!(harness::alive(worker.pid), "the worker lives on");
    let worker_log = worker.log_text();
    assert!(!worker_log.contains("panicked"), "{worker_log}");
    // The worker still takes work.
    let again = env.enqueue("argv", Some("plain"), &[("x", "y")]).await;
    eventually(
        "the worker to run another job",
        Duration::from_secs(20),
        async || (env.job(again).await.state == State::Succeeded).then_some(()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_meet_bad_input_sqlite() {
    harness::run_on(Kind::Sqlite, 1, "bad_input", steps_meet_bad_input).await;
}
