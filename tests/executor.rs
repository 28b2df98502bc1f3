//! The step executor and its supervisor, with real processes.
//!
//! `spawn` normally re-executes the running binary as the supervisor; here
//! the running binary is this test harness, so every test points it at the
//! built `jobdeck` with `set_supervisor_exe`.

use std::path::Path;
use std::time::{Duration, Instant};

use jobdeck::engine::executor::{self, OutputTail, StepEnd, StepSpec, StopReason};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

fn spec(dir: &Path, argv: &[&str]) -> StepSpec {
    executor::set_supervisor_exe(env!("CARGO_BIN_EXE_jobdeck"));
    StepSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: vec![("JOBDECK_JOB_ID".into(), "17".into())],
        timeout: None,
        kill_grace: Duration::from_secs(5),
        safety_margin: Duration::from_millis(100),
        initial_lease: Duration::from_secs(60),
        log_file: dir.join("logs/job-17.log"),
        tail: OutputTail::new(),
    }
}

fn sh(dir: &Path, script: &str) -> StepSpec {
    spec(dir, &["sh", "-c", script])
}

/// Whether `pid` still executes (a zombie does not: it waits for a reaper
/// that, once reparented, may be an init that never reaps).
fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None) != Err(Errno::ESRCH)
        && stat(pid).is_some_and(|s| s.0 != 'Z')
}

/// (state, parent pid) from /proc.
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after its ')' do not.
    let mut fields = text.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Polls until the step's pid is known.
async fn step_pid(handle: &executor::StepHandle) -> u32 {
    for _ in 0..500 {
        if let Some(pid) = handle.pid() {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the step's pid never became known");
}

/// Polls the tail for a line `PREFIX<pid>`.
async fn printed_pid(tail: &OutputTail, prefix: &str) -> u32 {
    for _ in 0..500 {
        if let Some(pid) = tail
            .lines()
            .iter()
            .find_map(|l| l.strip_prefix(prefix)?.parse().ok())
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {prefix} line in the output: {:?}", tail.lines());
}

#[tokio::test]
async fn success_returns_checkpoints_and_keeps_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let s = sh(
        dir.path(),
        "echo hello job $JOBDECK_JOB_ID; echo oops >&2; \
         echo '::jobdeck checkpoint last_id=7'; echo '::jobdeck checkpoint other=a=b'; \
         echo '::jobdeck checkpoint last_id=9'; echo '::jobdeck checkpoint bad-key=1'",
    );
    let tail = s.tail.clone();
    let log = s.log_file.clone();
    let end = executor::spawn(s).unwrap().wait().await;
    assert_eq!(
        end,
        StepEnd::Succeeded {
            checkpoints: vec![
                ("last_id".into(), "9".into()),
                ("other".into(), "a=b".into())
            ]
        }
    );
    let lines = tail.lines();
    assert!(lines.contains(&"hello job 17".to_string()), "{lines:?}");
    assert!(lines.contains(&"oops".to_string()), "{lines:?}");
    assert_eq!(lines.len(), 6);
    let logged = std::fs::read_to_string(log).unwrap();
    assert!(
        logged.contains("hello job 17\n") && logged.contains("oops\n"),
        "{logged}"
    );
}

#[tokio::test]
async fn the_log_file_is_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    for word in ["first", "second"] {
        let end = executor::spawn(spec(dir.path(), &["echo", word]))
            .unwrap()
            .wait()
            .await;
        assert!(matches!(end, StepEnd::Succeeded { .. }), "{end:?}");
    }
    let logged = std::fs::read_to_string(dir.path().join("logs/job-17.log")).unwrap();
    assert_eq!(logged, "first\nsecond\n");
}

#[tokio::test]
async fn non_zero_exit_fails_and_drops_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let s = sh(dir.path(), "echo '::jobdeck checkpoint k=1'; exit 3");
    let end = executor::spawn(s).unwrap().wait().await;
    assert_eq!(
        end,
        StepEnd::Failed {
            error: "exit code 3".into(),
            retry: true
        }
    );
}

#[tokio::test]
async fn a_step_killed_by_a_signal_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let end = executor::spawn(sh(dir.path(), "kill -SEGV $$"))
        .unwrap()
        .wait()
        .await;
    assert_eq!(
        end,
        StepEnd::Failed {
            error: "killed by signal SIGSEGV".into(),
            retry: true
        }
    );
}

#[tokio::test]
async fn a_missing_binary_fails_without_retry_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let end = executor::spawn(spec(dir.path(), &["rsynx-not-installed", "-a"]))
        .unwrap()
        .wait()
        .await;
    assert_eq!(
        end,
        StepEnd::Failed {
            error: "No such file or directory: 'rsynx-not-installed'".into(),
            retry: false
        }
    );
}

#[tokio::test]
async fn a_missing_working_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), &["true"]);
    s.cwd = Some(dir.path().join("nowhere"));
    let end = executor::spawn(s).unwrap().wait().await;
    let StepEnd::Failed {
        error,
        retry: false,
    } = end
    else {
        panic!("{end:?}")
    };
    assert!(
        error.starts_with("cannot use working directory") && error.contains("nowhere"),
        "{error}"
    );
}

#[tokio::test]
async fn the_working_directory_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), &["pwd"]);
    s.cwd = Some(dir.path().to_path_buf());
    let tail = s.tail.clone();
    let end = executor::spawn(s).unwrap().wait().await;
    assert!(matches!(end, StepEnd::Succeeded { .. }), "{end:?}");
    let canonical = dir.path().canonicalize().unwrap();
    assert_eq!(tail.lines(), vec![canonical.display().to_string()]);
}

#[tokio::test]
async fn timeout_kills_a_term_ignoring_group_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = sh(
        dir.path(),
        "trap '' TERM; sleep 1000 & echo grandchild=$!; while :; do sleep 0.05; done",
    );
    s.timeout = Some(Duration::from_millis(300));
    s.kill_grace = Duration::from_millis(700);
    let tail = s.tail.clone();
    let started = Instant::now();
    let handle = executor::spawn(s).unwrap();
    let step = step_pid(&handle).await;
    let grandchild = printed_pid(&tail, "grandchild=").await;
    assert!(alive(grandchild));
    let end = handle.wait().await;
    let took = started.elapsed();
    assert_eq!(
        end,
        StepEnd::TimedOut {
            after: Duration::from_millis(300)
        }
    );
    assert!(
        took >= Duration::from_millis(950),
        "SIGTERM was not ignored? took {took:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(!alive(step), "the step survived");
    assert!(!alive(grandchild), "the background grandchild survived");
}

#[tokio::test]
async fn stop_terminates_within_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), &["sleep", "30"]);
    s.kill_grace = Duration::from_secs(10);
    let handle = executor::spawn(s).unwrap();
    let step = step_pid(&handle).await;
    let started = Instant::now();
    // From another task, as the worker's cancel watcher would.
    let control = handle.control();
    tokio::spawn(async move { control.stop(StopReason::Cancel) });
    let end = handle.wait().await;
    assert_eq!(end, StepEnd::Stopped(StopReason::Cancel));
    // SIGTERM did it: the 10 s grace was not needed.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert!(!alive(step));
}

#[tokio::test]
async fn an_unrenewed_deadline_fences_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = sh(dir.path(), "sleep 1000 & echo grandchild=$!; sleep 1000");
    s.initial_lease = Duration::from_millis(1000);
    s.safety_margin = Duration::from_millis(300);
    // Fencing must not wait for the grace: the lease is moving elsewhere.
    s.kill_grace = Duration::from_secs(30);
    let tail = s.tail.clone();
    let started = Instant::now();
    let handle = executor::spawn(s).unwrap();
    let step = step_pid(&handle).await;
    let grandchild = printed_pid(&tail, "grandchild=").await;
    let end = handle.wait().await;
    let took = started.elapsed();
    assert_eq!(end, StepEnd::Fenced);
    // Local deadline = lease − margin = 700 ms after the supervisor started;
    // the slack covers its start-up on a busy machine.
    assert!(
        took >= Duration::from_millis(650),
        "fenced too early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1300),
        "fenced too late: {took:?}"
    );
    assert!(!alive(step) && !alive(grandchild));
}

#[tokio::test]
async fn fed_deadlines_keep_the_step_alive() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), &["sleep", "2"]);
    s.initial_lease = Duration::from_millis(500);
    s.safety_margin = Duration::from_millis(100);
    let handle = executor::spawn(s).unwrap();
    let control = handle.control();
    let feeder = tokio::spawn(async move {
        loop {
            control.feed_deadline(Duration::from_millis(500));
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    let started = Instant::now();
    let end = handle.wait().await;
    feeder.abort();
    assert_eq!(
        end,
        StepEnd::Succeeded {
            checkpoints: vec![]
        }
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_renewal_can_shorten_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), &["sleep", "30"]);
    s.initial_lease = Duration::from_secs(60);
    s.safety_margin = Duration::from_millis(100);
    let handle = executor::spawn(s).unwrap();
    step_pid(&handle).await;
    let started = Instant::now();
    handle.feed_deadline(Duration::from_millis(400));
    assert_eq!(handle.wait().await, StepEnd::Fenced);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn dropping_every_handle_stops_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let handle = executor::spawn(spec(dir.path(), &["sleep", "30"])).unwrap();
    let step = step_pid(&handle).await;
    drop(handle);
    for _ in 0..200 {
        if !alive(step) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the step outlived its handle");
}

#[tokio::test]
async fn a_dead_supervisor_fails_the_step_and_takes_its_group_down() {
    let dir = tempfile::tempdir().unwrap();
    let handle = executor::spawn(spec(dir.path(), &["sleep", "30"])).unwrap();
    let step = step_pid(&handle).await;
    let (_, supervisor) = stat(step).expect("the step runs");
    kill(
        Pid::from_raw(supervisor as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let end = handle.wait().await;
    let StepEnd::Failed { error, retry: true } = end else {
        panic!("{end:?}")
    };
    assert!(
        error.starts_with("step supervisor died unexpectedly"),
        "{error}"
    );
    // The executor's SIGKILL is sent, not necessarily delivered yet.
    let killed = Instant::now();
    while alive(step) {
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "the step outlived its supervisor"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn descendants_that_left_the_group_are_swept_too() {
    let dir = tempfile::tempdir().unwrap();
    // `setsid` puts the sleep in a session (and group) of its own, out of
    // reach of the group kill; only the supervisor's child sweep finds it.
    let s = sh(dir.path(), "setsid sleep 1000 & echo escaped=$!; sleep 0.2");
    let tail = s.tail.clone();
    let end = executor::spawn(s).unwrap().wait().await;
    assert!(matches!(end, StepEnd::Succeeded { .. }), "{end:?}");
    let escaped = printed_pid(&tail, "escaped=").await;
    assert!(!alive(escaped), "the escaped sleep survived");
}

#[tokio::test]
async fn huge_lines_and_binary_output_keep_the_tail_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let s = sh(
        dir.path(),
        "head -c 1000000 /dev/zero | tr '\\0' x; echo; head -c 200000 /dev/urandom; echo; \
         head -c 1000000 /dev/zero | tr '\\0' y; echo; echo done",
    );
    let tail = s.tail.clone();
    let log = s.log_file.clone();
    let end = executor::spawn(s).unwrap().wait().await;
    assert!(matches!(end, StepEnd::Succeeded { .. }), "{end:?}");
    let lines = tail.lines();
    assert!(lines.len() <= 200);
    assert!(
        lines.iter().all(|l| l.len() <= 2048 + 64),
        "a tail line is too long"
    );
    assert_eq!(lines.last().map(String::as_str), Some("done"));
    let huge = &lines[lines.len() - 2];
    assert!(
        huge.starts_with("yyyy") && huge.contains("more bytes]"),
        "{}",
        &huge[..100]
    );
    // The log keeps a capped prefix of each huge line, not a megabyte.
    let logged = std::fs::metadata(log).unwrap().len();
    assert!(logged < 600_000, "log is {logged} bytes");
}

#[tokio::test]
async fn arguments_reach_the_program_verbatim_without_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("x");
    std::fs::write(&victim, "keep").unwrap();
    let pwned = dir.path().join("pwned");
    let args = [
        format!("; rm -rf {}", victim.display()),
        format!("$(touch {})", pwned.display()),
        format!("`touch {}` && echo a | cat", pwned.display()),
        "two  spaces * ?".to_string(),
    ];
    let mut argv = vec!["printf", "%s\\n"];
    argv.extend(args.iter().map(String::as_str));
    let s = spec(dir.path(), &argv);
    let tail = s.tail.clone();
    let end = executor::spawn(s).unwrap().wait().await;
    assert!(matches!(end, StepEnd::Succeeded { .. }), "{end:?}");
    assert_eq!(tail.lines(), args.to_vec());
    assert!(victim.exists());
    assert!(!pwned.exists());
}

/// Not a test on its own: `parent_death_kills_the_step` runs this test
/// binary again with `JOBDECK_TEST_WORKER` set, as a stand-in worker that
/// starts a step, prints its pid and then waits to be killed.
#[test]
fn stand_in_worker() {
    let Some(dir) = std::env::var_os("JOBDECK_TEST_WORKER") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let handle = executor::spawn(spec(Path::new(&dir), &["sleep", "30"])).unwrap();
        let pid = step_pid(&handle).await;
        println!("STEP_PID={pid}");
        handle.wait().await;
    });
}

#[tokio::test]
async fn parent_death_kills_the_step() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut worker = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "stand_in_worker",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("JOBDECK_TEST_WORKER", dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(worker.stdout.take().unwrap());
    let step: u32 = stdout
        .lines()
        .map_while(Result::ok)
        // libtest prints "test stand_in_worker ... " before it.
        .find_map(|l| l.split_once("STEP_PID=")?.1.trim().parse().ok())
        .expect("the stand-in worker printed no step pid");
    assert!(alive(step));
    worker.kill().unwrap(); // SIGKILL: no chance to clean up
    worker.wait().unwrap();
    let killed = Instant::now();
    while alive(step) {
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "the step outlived its worker"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
