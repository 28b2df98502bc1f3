//! The line protocol between the executor and the supervisor: the
//! supervisor's command line ([`Options`]) and its final [`Report`].

use std::time::Duration;

/// How a supervised step ended, as reported to the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The step's main process exited by itself with this code.
    Exited(i32),
    /// The step's main process was killed by this signal (not by us).
    Signaled(String),
    /// The lease deadline passed unrenewed; the group was SIGKILLed.
    Fenced,
    /// Stopped on request (`stop`), or because the supervisor itself was
    /// told to terminate (`by_signal` names the signal then).
    Stopped { by_signal: Option<String> },
    /// The step could not be started; the message names the program.
    SpawnFailed(String),
}

impl Report {
    pub fn to_line(&self) -> String {
        match self {
            Report::Exited(code) => format!("exited {code}"),
            Report::Signaled(sig) => format!("signaled {sig}"),
            Report::Fenced => "fenced".to_string(),
            Report::Stopped { by_signal: None } => "stopped".to_string(),
            Report::Stopped {
                by_signal: Some(sig),
            } => format!("stopped {sig}"),
            Report::SpawnFailed(msg) => format!("spawn-failed {}", msg.replace('\n', " ")),
        }
    }

    pub fn parse(line: &str) -> Option<Report> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        Some(match word {
            "exited" => Report::Exited(rest.parse().ok()?),
            "signaled" => Report::Signaled(rest.to_string()),
            "fenced" => Report::Fenced,
            "stopped" if rest.is_empty() => Report::Stopped { by_signal: None },
            "stopped" => Report::Stopped {
                by_signal: Some(rest.to_string()),
            },
            "spawn-failed" => Report::SpawnFailed(rest.to_string()),
            _ => return None,
        })
    }
}

/// Options of the hidden `__supervise` mode, built by the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub kill_grace: Duration,
    pub safety_margin: Duration,
    pub initial_lease: Duration,
    /// The worker's pid, to tell a real parent death from a mere thread exit.
    pub parent_pid: Option<u32>,
    pub cwd: Option<String>,
    pub argv: Vec<String>,
}

impl Options {
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--kill-grace-ms".to_string(),
            self.kill_grace.as_millis().to_string(),
            "--safety-margin-ms".to_string(),
            self.safety_margin.as_millis().to_string(),
            "--initial-lease-ms".to_string(),
            self.initial_lease.as_millis().to_string(),
        ];
        if let Some(pid) = self.parent_pid {
            args.extend(["--parent-pid".to_string(), pid.to_string()]);
        }
        if let Some(cwd) = &self.cwd {
            args.extend(["--cwd".to_string(), cwd.clone()]);
        }
        args.push("--".to_string());
        args.extend(self.argv.iter().cloned());
        args
    }

    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut opts = Options {
            kill_grace: Duration::from_secs(10),
            safety_margin: Duration::ZERO,
            initial_lease: Duration::from_secs(30),
            parent_pid: None,
            cwd: None,
            argv: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if arg == "--" {
                opts.argv = it.cloned().collect();
                break;
            }
            let value = it.next().ok_or_else(|| format!("{arg} needs a value"))?;
            let ms = || {
                value
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| format!("{arg}: not a number of milliseconds: {value:?}"))
            };
            match arg.as_str() {
                "--kill-grace-ms" => opts.kill_grace = ms()?,
                "--safety-margin-ms" => opts.safety_margin = ms()?,
                "--initial-lease-ms" => opts.initial_lease = ms()?,
                "--parent-pid" => {
                    opts.parent_pid = Some(
                        value
                            .parse()
                            .map_err(|_| format!("--parent-pid: not a pid: {value:?}"))?,
                    )
                }
                "--cwd" => opts.cwd = Some(value.clone()),
                _ => return Err(format!("unknown option {arg}")),
            }
        }
        if opts.argv.is_empty() {
            return Err("no command to run (expected `-- PROGRAM ARGS…`)".to_string());
        }
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip() {
        for r in [
            Report::Exited(3),
            Report::Signaled("SIGSEGV".into()),
            Report::Fenced,
            Report::Stopped { by_signal: None },
            Report::Stopped {
                by_signal: Some("SIGTERM".into()),
            },
            Report::SpawnFailed("No such file or directory: 'rsynx'".into()),
        ] {
            assert_eq!(Report::parse(&r.to_line()), Some(r));
        }
        assert_eq!(Report::parse("pid 12"), None);
    }

    #[test]
    fn options_round_trip_and_keep_argv_verbatim() {
        let opts = Options {
            kill_grace: Duration::from_millis(1500),
            safety_margin: Duration::from_millis(250),
            initial_lease: Duration::from_secs(30),
            parent_pid: Some(42),
            cwd: Some("/tmp".into()),
            argv: vec![
                "echo".into(),
                "--".into(),
                "--cwd".into(),
                "; rm -rf /".into(),
            ],
        };
        assert_eq!(Options::parse(&opts.to_args()), Ok(opts));
    }

    #[test]
    fn bad_options_are_one_line_errors() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Options::parse(&args(&["--kill-grace-ms", "x", "--", "true"])),
            Err("--kill-grace-ms: not a number of milliseconds: \"x\"".into())
        );
        assert!(Options::parse(&args(&["--kill-grace-ms", "1"])).is_err());
        assert!(Options::parse(&args(&["--what", "1", "--", "true"])).is_err());
    }
}
