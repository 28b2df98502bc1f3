//! Scenario 2, the database restarts (Postgres): a throwaway cluster is
//! stopped (`pg_ctl stop -m fast`) in the middle of a run and started again
//! a few seconds later. Workers retry with backoff, say so in their logs and
//! finish everything: each job runs exactly once (the outage is shorter than
//! what the lease tolerates). A console watching the cluster shows "database
//! unreachable" meanwhile and keeps running.

use std::collections::BTreeSet;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobdeck::job::State;
use jobdeck::store::NewJob;
use portable_pty::{CommandBuilder, PtySize, native_pty_system};

use crate::audit::{self, LEDGER_STEP, pipeline};
use crate::cluster::Cluster;
use crate::harness::{self, Env, Kind, eventually};

const JOBS: usize = 150;
const TARGETS: usize = 10;
const DOWN_FOR: Duration = Duration::from_secs(3);

/// Long enough that a lease outlives the outage (the supervisor keeps the
/// step while `last renewal + lease − lease/4` is ahead), short enough that
/// a lost run would still show.
fn config() -> String {
    [
        "[workers]\nlease = \"20s\"\nkill_grace = \"1s\"\npoll = \"100ms\"\n".to_string(),
        pipeline("restart", "", LEDGER_STEP),
    ]
    .concat()
}

/// `jobdeck console` in a pseudo-terminal, its screen kept by a vt100
/// parser fed from a reader thread.
struct Console {
    child: Box<dyn portable_pty::Child + Send + Sync>,
    screen: Arc<Mutex<vt100::Parser>>,
    // The pty's writer: dropping it would hang the console up.
    _writer: Box<dyn std::io::Write + Send>,
}

impl Console {
    fn start(env: &Env, url: &str) -> Console {
        let pair = native_pty_system()
            .openpty(PtySize {
                rows: 32,
                cols: 120,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("open a pty");
        // The harness's pinned copy of the binary (others may rebuild).
        let mut cmd = CommandBuilder::new(env.path("jobdeck"));
        cmd.args(["--db", url, "console", "--no-workers", "--refresh", "200ms"]);
        cmd.cwd(env.dir.path());
        cmd.env("JOBDECK_DATA_DIR", env.path("console-data"));
        cmd.env("TERM", "xterm-256color");
        cmd.env_remove("JOBDECK_DB");
        let child = pair.slave.spawn_command(cmd).expect("start the console");
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().expect("pty reader");
        let writer = pair.master.take_writer().expect("pty writer");
        let screen = Arc::new(Mutex::new(vt100::Parser::new(
            32.try_into().expect("rows"),
            120.try_into().expect("cols"),
            0,
        )));
        let feed = screen.clone();
        std::thread::spawn(move || {
            let _master = pair.master;
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                feed.lock().unwrap().process(&buf[..n]);
            }
        });
        Console {
            child,
            screen,
            _writer: writer,
        }
    }

    fn text(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    async fn wait_for(&self, what: &str, within: Duration) {
        eventually(
            &format!("the console to show {what:?}"),
            within,
            async || self.text().contains(what).then_some(()),
        )
        .await;
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

async fn db_restart(env: Env) {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = cluster.url();
    let store = jobdeck::store::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to the throwaway cluster: {e}"));
    let config = env.config("restart.toml", &config());
    let jobs = (0..JOBS)
        .map(|n| NewJob {
            pipeline: "restart".into(),
            max_attempts: Some(1),
            target: Some(format!("t{n}", n = n % TARGETS)),
            args: [("pause".to_string(), serde_json::json!("0.1"))]
                .into_iter()
                .collect(),
            ..NewJob::default()
        })
        .collect();
    let ids: BTreeSet<i64> = store
        .enqueue_many(jobs, "operator:test@host")
        .await
        .expect("enqueue")
        .into_iter()
        .collect();
    let mut console = Console::start(&env, &url);
    console.wait_for("Queued", Duration::from_secs(20)).await;
    let mut workers: Vec<_> = (0..3)
        .map(|_| env.worker_on(&url, &config, &["--slots", "3", "--no-scheduler"]))
        .collect();

    let succeeded = async || {
        let counts = store.count_by_state().await.ok()?;
        counts.get(&State::Succeeded).copied()
    };
    eventually(
        "a third of the jobs to finish",
        Duration::from_secs(60),
        async || succeeded().await.filter(|n| *n >= (JOBS / 3) as i64),
    )
    .await;

    cluster.stop_server();
    let stopped = tokio::time::Instant::now();
    console
        .wait_for("database unreachable", Duration::from_secs(10))
        .await;
    tokio::time::sleep(DOWN_FOR.saturating_sub(stopped.elapsed())).await;
    cluster.start_server();

    eventually(
        "every job to finish",
        Duration::from_secs(120),
        async || succeeded().await.filter(|n| *n == JOBS as i64),
    )
    .await;
    // The console came back by itself.
    eventually(
        "the console to reconnect",
        Duration::from_secs(20),
        async || (!console.text().contains("database unreachable")).then_some(()),
    )
    .await;
    assert!(console.running(), "the console exited during the outage");

    for w in &mut workers {
        assert!(
            w.exit_within(Duration::ZERO).await.is_none(),
            "worker {} exited during the outage",
            w.pid
        );
    }
    let retried = workers
        .iter()
        .filter(|w| w.log_text().contains("retrying"))
        .count();
    assert!(retried > 0, "no worker log mentions the retry");
    for w in &workers {
        let log = w.log_text();
        assert!(
            !log.contains("panicked"),
            "worker {} panicked:\n{log}",
            w.pid
        );
    }

    // The ledger is the harness's; the jobs live in the throwaway cluster.
    let runs = audit::runs(&env);
    audit::assert_exclusive(&runs);
    let mut twice = Vec::new();
    for id in &ids {
        let job = store.get_job(*id).await.expect("read job");
        assert_eq!(job.state, State::Succeeded, "job {id}");
        assert_eq!(job.attempt, 1, "job {id} ran more than once");
        let run = runs
            .get(&(*id, 1))
            .unwrap_or_else(|| panic!("job {id}: no run"));
        if run.end.is_none() {
            twice.push(*id);
        }
    }
    assert!(twice.is_empty(), "runs without an end: {twice:?}");
    assert_eq!(runs.len(), JOBS, "each job started exactly once");
    assert!(store.list_locks().await.expect("locks").is_empty());
    eprintln!(
        "RESULT db_restart: {JOBS} jobs, server down {:.1}s, {retried}/3 worker logs \
         with retries, runs {}, duplicated 0, lost 0, console survived",
        DOWN_FOR.as_secs_f64(),
        runs.len()
    );
    drop(workers);
    drop(console);
}

/// Runs without `JOBDECK_TEST_POSTGRES`: the cluster is the test's own. The
/// harness's SQLite environment only provides the temp dir and the binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart() {
    harness::run_on(Kind::Sqlite, 2, "db_restart", db_restart).await;
}
