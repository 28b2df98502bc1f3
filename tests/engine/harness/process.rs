//! The real `jobdeck` binary: worker processes and one-shot commands.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::Env;

const BIN: &str = env!("CARGO_BIN_EXE_jobdeck");

/// The binary this test runs: a hard link (else a copy) of the built one in
/// the test's directory. Others rebuild the shared target directory while
/// tests run; a replaced binary would leave workers unable to start their
/// step supervisors (`/proc/self/exe` deleted).
pub(super) fn pin_binary(dir: &Path) -> PathBuf {
    let pinned = dir.join("jobdeck");
    if std::fs::hard_link(BIN, &pinned).is_err() {
        std::fs::copy(BIN, &pinned).unwrap_or_else(|e| panic!("copy {BIN}: {e}"));
    }
    pinned
}

fn command(env: &Env, url: &str) -> Command {
    let mut cmd = Command::new(&env.bin);
    cmd.arg("--db")
        .arg(url)
        // No ./jobdeck.toml here: commands without --config have no pipelines.
        .current_dir(env.dir.path())
        .env("JOBDECK_DATA_DIR", env.path("data"))
        .env("LEDGER", env.ledger())
        .env_remove("JOBDECK_DB")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    cmd
}

/// A `jobdeck worker` process, SIGKILLed when dropped.
pub struct Worker {
    child: Child,
    pub pid: i32,
    pub log: PathBuf,
}

impl Worker {
    pub(super) fn spawn(env: &Env, n: u32, url: &str, config: &Path, args: &[&str]) -> Worker {
        let log = env.path(&format!("worker-{n}.log"));
        let file = std::fs::File::create(&log).expect("create the worker log");
        let child = command(env, url)
            .arg("--config")
            .arg(config)
            .arg("worker")
            .args(args)
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {} worker: {e}", env.bin.display()));
        let pid = child.id().expect("a running child has a pid") as i32;
        Worker { child, pid, log }
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid), sig)
            .unwrap_or_else(|e| panic!("{sig} to worker {}: {e}", self.pid));
    }

    /// `kill -9`, and reap it.
    pub async fn kill9(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait().await;
    }

    /// The exit status, or `None` if it is still running after `within`.
    pub async fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .map(|r| r.expect("wait for the worker"))
    }

    /// This worker's id, as registered in the database (found by pid).
    pub async fn id(&self, env: &Env) -> String {
        let pid = self.pid as i64;
        super::eventually(
            &format!("worker pid {pid} to register"),
            Duration::from_secs(15),
            async || {
                let workers = env.store.list_workers().await.ok()?;
                workers.into_iter().find(|w| w.pid == pid).map(|w| w.id)
            },
        )
        .await
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A stopped worker must not linger stopped (kill_on_drop's SIGKILL
        // works on it anyway, but be explicit for the supervisors' sake).
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGCONT);
    }
}

/// The result of one `jobdeck …` command.
#[derive(Debug)]
pub struct Cli {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Cli {
    pub(super) async fn run(env: &Env, args: &[&str]) -> Cli {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            command(env, &env.url)
                .args(args)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("jobdeck {args:?} did not finish within 60s"))
        .unwrap_or_else(|e| panic!("run jobdeck {args:?}: {e}"));
        Cli {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Whether process `pid` still exists (a zombie counts as gone: it runs
/// nothing any more).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
