//! The self-fencing supervisor: `jobdeck __supervise OPTIONS -- ARGV…`.
//!
//! One supervisor stands between the worker and each step's process group
//! (DESIGN.md "Self-fencing"). It runs in its own session, so a terminal ^C
//! aimed at the worker does not reach it, and kills the step's whole group
//! when:
//! - the worker dies (EOF on the control socket, or the parent-death signal),
//! - the lease deadline fed by the worker passes unrenewed (SIGKILL at once:
//!   the lease is about to move to another worker),
//! - the worker asks it to `stop` (SIGTERM, kill grace, SIGKILL),
//! - the step's main process exits (whatever it left behind is killed too).
//!
//! Wire protocol, one line each way on the control socket (the supervisor's
//! stdin, a Unix socket pair; the step gets /dev/null):
//! - worker → supervisor: `deadline MS` (the lease has MS ms left), `stop`;
//! - supervisor → worker: `pid N` once the step runs, then exactly one
//!   [`Report`] line.
//!
//! The step's stdout/stderr are the supervisor's own, i.e. the worker's pipes,
//! so output never passes through this process.
//!
//! It is a plain synchronous loop (no runtime): `ppoll` on the control socket
//! with every handled signal blocked except while waiting, so no signal can
//! slip in between a check and the wait.

use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::signal::{killpg, sigaction, sigprocmask};
use nix::sys::time::TimeSpec;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{Pid, getppid, setsid};

mod protocol;
pub use protocol::{Options, Report};

/// Entry point of `jobdeck __supervise ARGS…`; returns the process exit code
/// (0 once a report was delivered, 2 on bad arguments, 3 without a worker).
pub fn main(args: Vec<String>) -> i32 {
    let opts = match Options::parse(&args) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("jobdeck __supervise: {e}");
            return 2;
        }
    };
    // SAFETY: fd 0 is the control socket the executor handed us; nothing
    // else in this process uses it.
    let control = UnixStream::from(unsafe { OwnedFd::from_raw_fd(0) });
    if control.local_addr().is_err() {
        eprintln!("jobdeck __supervise: stdin is not a control socket; run by jobdeck only");
        return 2;
    }
    // The loop reads the socket after every wake-up, including a timeout
    // with nothing to read: a blocking read would park the supervisor until
    // the worker speaks again, so a frozen worker would never be fenced.
    if let Err(e) = control.set_nonblocking(true) {
        eprintln!("jobdeck __supervise: cannot make the control socket non-blocking: {e}");
        return 2;
    }
    Supervisor::new(opts, control).run()
}

static GOT_SIGCHLD: AtomicBool = AtomicBool::new(false);
static GOT_TERMINATE: AtomicBool = AtomicBool::new(false);
static GOT_PARENT_DEATH: AtomicBool = AtomicBool::new(false);
static TERMINATE_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Sent by the kernel when the worker dies. Not SIGKILL: we must survive it
/// to kill the step's group.
const PARENT_DEATH: Signal = Signal::SIGUSR1;
const TERMINATE: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

extern "C" fn on_signal(sig: nix::libc::c_int) {
    // Only atomics here: this runs in signal context.
    if sig == Signal::SIGCHLD as i32 {
        GOT_SIGCHLD.store(true, Ordering::SeqCst);
    } else if sig == PARENT_DEATH as i32 {
        GOT_PARENT_DEATH.store(true, Ordering::SeqCst);
    } else {
        TERMINATE_SIGNAL.store(sig, Ordering::SeqCst);
        GOT_TERMINATE.store(true, Ordering::SeqCst);
    }
}

fn handled_signals() -> SigSet {
    let mut handled = SigSet::empty();
    handled.add(Signal::SIGCHLD);
    handled.add(PARENT_DEATH);
    for sig in TERMINATE {
        handled.add(sig);
    }
    handled
}

/// Installs [`on_signal`]. A signal that arrives before [`block_signals`]
/// only sets its flag, which the first pass of the loop sees.
fn install_signals() {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_NOCLDSTOP,
        SigSet::empty(),
    );
    for sig in handled_signals().iter() {
        // SAFETY: the handler only touches atomics.
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// Blocks the handled signals outside `ppoll`; returns the mask to wait
/// with. Called only after the step is spawned: a child inherits the
/// signal mask, and a step with SIGTERM blocked could not be stopped.
fn block_signals() -> SigSet {
    let handled = handled_signals();
    let mut mask = SigSet::empty();
    // Cannot fail with valid signals; if it did, the loop would still work,
    // with wake-ups up to a tick late.
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled), Some(&mut mask));
    for sig in handled.iter() {
        mask.remove(sig);
    }
    mask
}

/// Nanoseconds on CLOCK_BOOTTIME, which keeps counting while the machine
/// sleeps: a suspended host must not wake up believing its lease is fresh.
fn boot_now() -> u128 {
    let ts = clock_gettime(ClockId::CLOCK_BOOTTIME).unwrap_or_else(|_| TimeSpec::new(0, 0));
    Duration::from(ts).as_nanos()
}

fn nanos(d: Duration) -> u128 {
    d.as_nanos()
}

/// Why the group is being brought down.
#[derive(Debug, Clone, PartialEq)]
enum Ending {
    Fenced,
    Stopped { by_signal: Option<String> },
    WorkerGone,
}

struct Supervisor {
    opts: Options,
    control: UnixStream,
    control_open: bool,
    inbox: Vec<u8>,
    wait_mask: SigSet,
    /// Boot-clock time after which the group is killed without grace.
    deadline: u128,
    /// Boot-clock time at which a graceful stop turns into SIGKILL.
    kill_at: Option<u128>,
    ending: Option<Ending>,
}

impl Supervisor {
    fn new(opts: Options, control: UnixStream) -> Supervisor {
        let deadline =
            boot_now() + nanos(opts.initial_lease).saturating_sub(nanos(opts.safety_margin));
        Supervisor {
            opts,
            control,
            control_open: true,
            inbox: Vec::new(),
            wait_mask: SigSet::empty(),
            deadline,
            kill_at: None,
            ending: None,
        }
    }

    fn report(&mut self, line: &str) {
        // The worker may be gone: then nobody is listening and that is fine.
        let _ = self.control.write_all(format!("{line}\n").as_bytes());
    }

    fn run(mut self) -> i32 {
        // Own session: job-control signals for the worker's terminal stay
        // there. Fails only if we already lead a group, which is harmless.
        let _ = setsid();
        install_signals();
        let _ = nix::sys::prctl::set_pdeathsig(PARENT_DEATH);
        // Orphans of the step (double-forked daemons) come back to us so the
        // final sweep can kill them too.
        let _ = nix::sys::prctl::set_child_subreaper(true);
        if let Some(parent) = self.opts.parent_pid
            && getppid().as_raw() as u32 != parent
        {
            // The worker died before the death signal was armed.
            return 3;
        }

        let step = match self.spawn_step() {
            Ok(pid) => pid,
            Err(msg) => {
                self.report(&Report::SpawnFailed(msg).to_line());
                return 0;
            }
        };
        self.wait_mask = block_signals();
        self.report(&format!("pid {step}"));
        let report = self.supervise(step);
        sweep_children();
        if self.ending == Some(Ending::WorkerGone) {
            return 3;
        }
        self.report(&report.to_line());
        0
    }

    fn spawn_step(&self) -> Result<Pid, String> {
        let program = &self.opts.argv[0];
        let mut cmd = Command::new(program);
        cmd.args(&self.opts.argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            // Own group, led by the step: one killpg reaches every descendant
            // that did not leave it on purpose.
            .process_group(0);
        if let Some(cwd) = &self.opts.cwd {
            // Checked here so a bad directory is not reported as a missing
            // program (both are ENOENT from exec).
            if let Err(e) = std::fs::read_dir(cwd) {
                return Err(format!(
                    "cannot use working directory '{cwd}': {}",
                    io_reason(&e)
                ));
            }
            cmd.current_dir(cwd);
        }
        match cmd.spawn() {
            // The std handle is dropped without waiting: reaping is done
            // below with waitid, so that the group id stays reserved (the
            // exited leader is still a zombie) while we kill the group.
            Ok(child) => Ok(Pid::from_raw(child.id() as i32)),
            Err(e) => Err(format!("{}: '{program}'", io_reason(&e))),
        }
    }

    /// Watches the step until its main process exits; returns the report.
    fn supervise(&mut self, step: Pid) -> Report {
        loop {
            if let Some(status) = step_exit(step) {
                // Kill leftovers before reaping: the zombie leader keeps the
                // group id from being reused by an unrelated process.
                let _ = killpg(step, Signal::SIGKILL);
                let _ = waitpid(step, None);
                return match self.ending.take() {
                    Some(Ending::Fenced) => Report::Fenced,
                    Some(Ending::Stopped { by_signal }) => Report::Stopped { by_signal },
                    Some(Ending::WorkerGone) => {
                        self.ending = Some(Ending::WorkerGone);
                        Report::Stopped { by_signal: None }
                    }
                    None => status,
                };
            }
            let now = boot_now();
            if now >= self.deadline && self.ending != Some(Ending::Fenced) {
                let _ = killpg(step, Signal::SIGKILL);
                // A fence overrides any stop in progress: the lease is gone.
                self.ending = Some(Ending::Fenced);
                self.kill_at = None;
            }
            if let Some(at) = self.kill_at
                && now >= at
            {
                let _ = killpg(step, Signal::SIGKILL);
                self.kill_at = None;
            }
            let readable = self.wait(now);
            self.handle_signals(step);
            if readable {
                self.read_control(step);
            }
        }
    }

    /// Sleeps until a signal, control input or the next timer; returns
    /// whether the control socket can be read without blocking.
    fn wait(&mut self, now: u128) -> bool {
        // A 1 s tick bounds how late a missed wake-up (or a clock jump
        // across a suspend, which ppoll's monotonic timeout ignores) can be.
        let mut timeout = nanos(Duration::from_secs(1));
        if self.ending != Some(Ending::Fenced) {
            timeout = timeout.min(self.deadline.saturating_sub(now));
        }
        if let Some(at) = self.kill_at {
            timeout = timeout.min(at.saturating_sub(now));
        }
        let timeout = TimeSpec::from_duration(Duration::from_nanos(timeout as u64));
        let mut fds = Vec::new();
        if self.control_open {
            fds.push(PollFd::new(self.control.as_fd(), PollFlags::POLLIN));
        }
        match ppoll(&mut fds, Some(timeout), Some(self.wait_mask)) {
            Ok(_) => fds.first().and_then(PollFd::revents).is_some_and(|r| {
                r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            }),
            Err(Errno::EINTR) => false,
            // Should not happen; avoid spinning if it does.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                false
            }
        }
    }

    fn handle_signals(&mut self, step: Pid) {
        GOT_SIGCHLD.store(false, Ordering::SeqCst);
        reap_orphans(step);
        if GOT_PARENT_DEATH.swap(false, Ordering::SeqCst) {
            // The signal also fires when the worker *thread* that spawned us
            // exits; only a changed parent means the process is gone.
            let orphaned = match self.opts.parent_pid {
                Some(parent) => getppid().as_raw() as u32 != parent,
                None => true,
            };
            if orphaned {
                self.worker_gone(step);
            }
        }
        if GOT_TERMINATE.swap(false, Ordering::SeqCst) {
            let sig = Signal::try_from(TERMINATE_SIGNAL.load(Ordering::SeqCst))
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| "a signal".to_string());
            self.begin_stop(
                step,
                Ending::Stopped {
                    by_signal: Some(sig),
                },
            );
        }
    }

    fn read_control(&mut self, step: Pid) {
        let mut buf = [0u8; 4096];
        match self.control.read(&mut buf) {
            Ok(0) => self.worker_gone(step),
            Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => self.worker_gone(step),
        }
        while let Some(end) = self.inbox.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.inbox.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            self.command(step, line.trim());
        }
        // A worker never sends long lines; don't let a broken one grow this.
        if self.inbox.len() > 4096 {
            self.inbox.clear();
        }
    }

    fn command(&mut self, step: Pid, line: &str) {
        if line == "stop" {
            self.begin_stop(step, Ending::Stopped { by_signal: None });
        } else if let Some(ms) = line
            .strip_prefix("deadline ")
            .and_then(|v| v.parse::<u64>().ok())
            // Once fenced the group is dead: a late renewal changes nothing.
            && self.ending != Some(Ending::Fenced)
        {
            let left =
                nanos(Duration::from_millis(ms)).saturating_sub(nanos(self.opts.safety_margin));
            self.deadline = boot_now() + left;
        }
        // Anything else is ignored: a newer worker may know more words.
    }

    fn worker_gone(&mut self, step: Pid) {
        self.control_open = false;
        if self.ending.is_none() || matches!(self.ending, Some(Ending::Stopped { .. })) {
            self.begin_stop(step, Ending::WorkerGone);
            // Nobody will read a report; keep the WorkerGone ending.
            self.ending = Some(Ending::WorkerGone);
        }
    }

    /// SIGTERM to the group now, SIGKILL after the kill grace (only the
    /// first request starts the clock).
    fn begin_stop(&mut self, step: Pid, ending: Ending) {
        if self.ending.is_some() {
            return;
        }
        let _ = killpg(step, Signal::SIGTERM);
        self.kill_at = Some(boot_now() + nanos(self.opts.kill_grace));
        self.ending = Some(ending);
    }
}

/// The step's exit status if its main process has ended, without reaping it.
fn step_exit(step: Pid) -> Option<Report> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(step), flags) {
        Ok(WaitStatus::Exited(_, code)) => Some(Report::Exited(code)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(Report::Signaled(sig.as_str().to_string())),
        Ok(_) => None,
        // ECHILD: already reaped, which only this code does; treat as gone.
        Err(_) => Some(Report::Exited(-1)),
    }
}

/// Reaps reparented orphans that died, leaving the step's own zombie alone.
fn reap_orphans(step: Pid) {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    while let Ok(status) = waitid(Id::All, flags) {
        match status.pid() {
            Some(pid) if pid != step => {
                let _ = waitpid(pid, None);
            }
            _ => return,
        }
    }
}

/// After the step's group is gone: kill and reap every process that was
/// reparented to us (descendants that left the group), until none is left,
/// so that the report means "nothing of this step still runs". Gives up
/// after 2 s (a process stuck in uninterruptible I/O cannot be reaped).
fn sweep_children() {
    let give_up = boot_now() + nanos(Duration::from_secs(2));
    loop {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(_) => return, // ECHILD: every child is dead and reaped
            }
        }
        if boot_now() > give_up {
            return;
        }
        // Killed again each pass: their own orphans keep arriving.
        for pid in children_of_self() {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn children_of_self() -> Vec<Pid> {
    let me = std::process::id();
    std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .map(Pid::from_raw)
        .collect()
}

/// The OS reason without Rust's "(os error N)" suffix.
fn io_reason(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => Errno::from_raw(code).desc().to_string(),
        None => e.to_string(),
    }
}
