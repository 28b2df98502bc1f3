//! Runs one command step under a supervisor (see [`super::supervisor`]) and
//! turns what happened into a [`StepEnd`].
//!
//! The step is started as `jobdeck __supervise … -- ARGV…`. The executor
//! talks to the supervisor over a Unix socket pair on the supervisor's
//! stdin (deadlines and stop requests out, the step's pid and one final
//! report back), and reads the step's stdout and stderr, which the
//! supervisor passes through untouched, into the log file and the tail.
//!
//! Dropping the handle and every [`StepControl`] stops the step (SIGTERM,
//! kill grace, SIGKILL); the worker dying closes the socket, and the
//! supervisor then stops the step's process group on its own.
//!
//! Which binary is the supervisor: [`set_supervisor_exe`] if called, else the
//! `JOBDECK_SUPERVISOR_EXE` environment variable, else the running
//! executable. Tests need one of the first two, because there the running
//! executable is the test harness, not jobdeck.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::output::{RawLine, Sink, split_lines};
use super::supervisor::{Options, Report};

pub use super::output::OutputTail;

/// Everything needed to run one command step.
#[derive(Debug, Clone)]
pub struct StepSpec {
    /// Program and arguments; no shell is involved. `argv[0]` is looked up
    /// on `PATH` unless it contains a `/`.
    pub argv: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// Added to the worker's environment (JOBDECK_JOB_ID, …).
    pub env: Vec<(String, String)>,
    pub timeout: Option<Duration>,
    /// SIGTERM → SIGKILL delay when stopping the step.
    pub kill_grace: Duration,
    /// Subtracted from every remaining lease fed to the supervisor.
    pub safety_margin: Duration,
    /// The lease the job has at start, valid until the first
    /// [`StepHandle::feed_deadline`].
    pub initial_lease: Duration,
    /// Every output line is appended here (parent directories are created).
    pub log_file: PathBuf,
    pub tail: OutputTail,
}

/// Why the worker stops a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancel,
    LeaseLost,
    Shutdown,
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepEnd {
    /// Exit code 0; the checkpoints it printed, one per key (last wins).
    Succeeded {
        checkpoints: Vec<(String, String)>,
    },
    /// Non-zero exit, killed by a signal, or could not be started
    /// (`retry: false`: running it again cannot help).
    Failed {
        error: String,
        retry: bool,
    },
    TimedOut {
        after: Duration,
    },
    Stopped(StopReason),
    /// The lease deadline passed without renewal and the supervisor killed
    /// the step: the lease is lost, the worker must write nothing for it.
    Fenced,
}

static SUPERVISOR_EXE: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Use `path` as the supervisor binary for all later [`spawn`]s.
pub fn set_supervisor_exe(path: impl Into<PathBuf>) {
    *SUPERVISOR_EXE.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.into());
}

fn supervisor_exe() -> Result<PathBuf, String> {
    if let Some(path) = SUPERVISOR_EXE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
    {
        return Ok(path);
    }
    if let Some(path) = std::env::var_os("JOBDECK_SUPERVISOR_EXE") {
        return Ok(PathBuf::from(path));
    }
    std::env::current_exe().map_err(|e| format!("cannot find the jobdeck executable: {e}"))
}

enum Cmd {
    Deadline(Duration),
    Stop(StopReason),
}

/// A running step. Control methods take `&self`; [`StepHandle::control`]
/// gives a clonable controller for other tasks while one awaits
/// [`StepHandle::wait`].
pub struct StepHandle {
    control: StepControl,
    done: JoinHandle<StepEnd>,
}

/// Feeds deadlines to, or stops, a running step. Cheap to clone; does
/// nothing once the step has ended.
#[derive(Debug, Clone)]
pub struct StepControl {
    cmds: mpsc::UnboundedSender<Cmd>,
    pid: Arc<AtomicU32>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cmd::Deadline(d) => write!(f, "Deadline({d:?})"),
            Cmd::Stop(r) => write!(f, "Stop({r:?})"),
        }
    }
}

impl StepControl {
    /// The step process's pid, once the supervisor has started it.
    pub fn pid(&self) -> Option<u32> {
        match self.pid.load(Ordering::SeqCst) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// The lease has `remaining` left, counted from when the renewal that
    /// learned it was sent (subtract the round trip if it was long).
    pub fn feed_deadline(&self, remaining: Duration) {
        let _ = self.cmds.send(Cmd::Deadline(remaining));
    }

    /// SIGTERM the step's group, SIGKILL after the kill grace. Only the
    /// first reason counts.
    pub fn stop(&self, reason: StopReason) {
        let _ = self.cmds.send(Cmd::Stop(reason));
    }
}

impl StepHandle {
    pub fn control(&self) -> StepControl {
        self.control.clone()
    }
    pub fn pid(&self) -> Option<u32> {
        self.control.pid()
    }
    pub fn feed_deadline(&self, remaining: Duration) {
        self.control.feed_deadline(remaining)
    }
    pub fn stop(&self, reason: StopReason) {
        self.control.stop(reason)
    }

    /// Resolves when the step and everything it started are gone.
    pub async fn wait(self) -> StepEnd {
        // Hold our controller while waiting: the step is stopped once every
        // controller is gone, and the waiter still cares about the step.
        let StepHandle { control, done } = self;
        let end = done.await;
        drop(control);
        match end {
            Ok(end) => end,
            Err(e) => StepEnd::Failed {
                error: format!("step executor task failed: {e}"),
                retry: true,
            },
        }
    }
}

/// Starts the step under a supervisor. Errs only when the supervisor
/// itself (or the log file) cannot be set up; a step that cannot start
/// ends as [`StepEnd::Failed`] with `retry: false`. Must be called inside a
/// tokio runtime.
pub fn spawn(spec: StepSpec) -> Result<StepHandle, String> {
    if spec.argv.is_empty() {
        return Err("the step has an empty command".to_string());
    }
    let log = open_log(&spec.log_file)?;
    let exe = supervisor_exe()?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .and_then(|(a, b)| a.set_nonblocking(true).map(|_| (a, b)))
        .map_err(|e| format!("cannot create the supervisor's control socket: {e}"))?;
    let ours = UnixStream::from_std(ours)
        .map_err(|e| format!("cannot create the supervisor's control socket: {e}"))?;
    let opts = Options {
        kill_grace: spec.kill_grace,
        safety_margin: spec.safety_margin,
        initial_lease: spec.initial_lease,
        parent_pid: Some(std::process::id()),
        cwd: spec.cwd.as_ref().map(|p| p.to_string_lossy().into_owned()),
        argv: spec.argv.clone(),
    };
    let child = {
        let mut cmd = Command::new(&exe);
        cmd.arg("__supervise")
            .args(opts.to_args())
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn()
        // `cmd` drops here and with it our copy of the supervisor's end of
        // the socket: from now on only the supervisor holds it, so our
        // death is its EOF.
    }
    .map_err(|e| format!("cannot start the step supervisor {}: {e}", exe.display()))?;

    let (cmds, cmd_rx) = mpsc::unbounded_channel();
    let pid = Arc::new(AtomicU32::new(0));
    let control = StepControl {
        cmds,
        pid: pid.clone(),
    };
    let done = tokio::spawn(drive(child, ours, cmd_rx, pid, spec, log));
    Ok(StepHandle { control, done })
}

fn open_log(path: &Path) -> Result<tokio::fs::File, String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create log directory {}: {e}", dir.display()))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(tokio::fs::File::from_std)
        .map_err(|e| format!("cannot open log file {}: {e}", path.display()))
}

/// Why the executor asked for a stop.
#[derive(Debug, Clone, Copy)]
enum Asked {
    Reason(StopReason),
    Timeout,
}

/// How long to wait for the output pipes after the step is reported gone.
/// Normally instant; only a descendant that escaped both the process group
/// and the supervisor's sweep could hold them open.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

async fn drive(
    mut child: Child,
    control: UnixStream,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    pid: Arc<AtomicU32>,
    spec: StepSpec,
    log: tokio::fs::File,
) -> StepEnd {
    let (lines_tx, lines_rx) = mpsc::channel::<RawLine>(256);
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(split_lines(out, lines_tx.clone())));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(split_lines(err, lines_tx.clone())));
    }
    drop(lines_tx);
    let sink = Sink {
        log: tokio::io::BufWriter::new(log),
        tail: spec.tail.clone(),
        checkpoints: Vec::new(),
    };
    let sink = tokio::spawn(sink.run(lines_rx));

    let (reports, mut writer) = control.into_split();
    let mut reports = BufReader::new(reports).lines();
    let timeout = async {
        match spec.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timeout);
    let mut asked: Option<Asked> = None;
    let mut cmds_open = true;

    let report = loop {
        tokio::select! {
            cmd = cmds.recv(), if cmds_open => match cmd {
                None => {
                    // Every handle and controller is gone (the slot's task
                    // was dropped): nobody will act on the result.
                    cmds_open = false;
                    if asked.is_none() {
                        asked = Some(Asked::Reason(StopReason::Shutdown));
                        send(&mut writer, "stop").await;
                    }
                }
                Some(Cmd::Deadline(left)) => send(&mut writer, &format!("deadline {}", left.as_millis())).await,
                Some(Cmd::Stop(reason)) => {
                    if asked.is_none() {
                        asked = Some(Asked::Reason(reason));
                        send(&mut writer, "stop").await;
                    }
                }
            },
            () = &mut timeout, if asked.is_none() => {
                asked = Some(Asked::Timeout);
                send(&mut writer, "stop").await;
            }
            line = reports.next_line() => match line {
                Ok(Some(line)) => {
                    if let Some(n) = line.strip_prefix("pid ").and_then(|n| n.parse().ok()) {
                        pid.store(n, Ordering::SeqCst);
                    } else if let Some(report) = Report::parse(&line) {
                        break Some(report);
                    }
                }
                Ok(None) | Err(_) => break None,
            }
        }
    };

    if report.is_none() {
        // The supervisor died without a word: nobody guards the step any
        // more, so take its group down from here.
        if let Some(step) = pid_of(&pid) {
            let _ = nix::sys::signal::killpg(step, nix::sys::signal::Signal::SIGKILL);
        }
    }
    let drained = tokio::time::timeout(OUTPUT_DRAIN, futures::future::join_all(&mut readers)).await;
    if drained.is_err() {
        for reader in &readers {
            reader.abort();
        }
    }
    let checkpoints = sink.await.unwrap_or_default();
    let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        _ => {
            let _ = child.start_kill();
            "did not exit".to_string()
        }
    };

    let Some(report) = report else {
        return StepEnd::Failed {
            error: format!("step supervisor died unexpectedly ({status})"),
            retry: true,
        };
    };
    match (report, asked) {
        (Report::Fenced, _) => StepEnd::Fenced,
        (Report::Stopped { by_signal: None }, Some(Asked::Timeout)) => StepEnd::TimedOut {
            after: spec.timeout.unwrap_or_default(),
        },
        (Report::Stopped { by_signal: None }, Some(Asked::Reason(reason))) => {
            StepEnd::Stopped(reason)
        }
        (Report::Stopped { by_signal: None }, None) => StepEnd::Failed {
            error: "step stopped without a request".to_string(),
            retry: true,
        },
        (
            Report::Stopped {
                by_signal: Some(sig),
            },
            _,
        ) => StepEnd::Failed {
            error: format!("step stopped: its supervisor received {sig}"),
            retry: true,
        },
        (Report::Exited(0), _) => StepEnd::Succeeded { checkpoints },
        (Report::Exited(code), _) => StepEnd::Failed {
            error: format!("exit code {code}"),
            retry: true,
        },
        (Report::Signaled(sig), _) => StepEnd::Failed {
            error: format!("killed by signal {sig}"),
            retry: true,
        },
        (Report::SpawnFailed(error), _) => StepEnd::Failed {
            error,
            retry: false,
        },
    }
}

fn pid_of(pid: &AtomicU32) -> Option<nix::unistd::Pid> {
    match pid.load(Ordering::SeqCst) {
        0 => None,
        n => Some(nix::unistd::Pid::from_raw(n as i32)),
    }
}

async fn send(writer: &mut OwnedWriteHalf, line: &str) {
    // A failed write means the supervisor is gone; its report (or silence)
    // on the read side says what happened.
    let _ = writer.write_all(format!("{line}\n").as_bytes()).await;
}
