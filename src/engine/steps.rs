//! Running one step: built-ins inside the worker, commands under the
//! supervisor. Both answer with the executor's `StepEnd`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::registry::JobSignal;
use super::runtime::Ctx;
use crate::config::{Builtin, Step, StepAction};
use crate::engine::executor::{self, OutputTail, StepEnd, StepSpec, StopReason};
use crate::job::Job;

pub struct StepContext<'a> {
    pub ctx: &'a Arc<Ctx>,
    pub job: &'a Job,
    pub attempt: i32,
    pub fence: Option<i64>,
    pub index: usize,
    pub step: &'a Step,
    pub checkpoints: &'a [(String, String)],
    pub tail: &'a OutputTail,
    /// The pipeline's whole-job timeout, if any.
    pub job_deadline: Option<Instant>,
}

impl StepContext<'_> {
    /// The tighter of the step's own timeout and what is left of the job's.
    fn timeout(&self) -> Option<Duration> {
        let left = self
            .job_deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        match (self.step.timeout, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        let job = self.job;
        let mut env = vec![
            ("JOBDECK_JOB_ID".to_string(), job.id.to_string()),
            ("JOBDECK_PIPELINE".to_string(), job.pipeline.clone()),
            (
                "JOBDECK_TARGET".to_string(),
                job.target.clone().unwrap_or_default(),
            ),
            ("JOBDECK_ATTEMPT".to_string(), self.attempt.to_string()),
            ("JOBDECK_STEP".to_string(), self.step.name.clone()),
            ("JOBDECK_STEP_INDEX".to_string(), self.index.to_string()),
            (
                "JOBDECK_FENCE".to_string(),
                self.fence.map(|f| f.to_string()).unwrap_or_default(),
            ),
        ];
        for (k, v) in &job.args {
            let value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            env.push((format!("JOBDECK_ARG_{}", env_name(k)), value));
        }
        for (k, v) in self.checkpoints {
            env.push((format!("JOBDECK_CHECKPOINT_{}", env_name(k)), v.clone()));
        }
        env
    }
}

fn env_name(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

pub async fn run(s: StepContext<'_>, signals: &mut UnboundedReceiver<JobSignal>) -> StepEnd {
    match &s.step.action {
        StepAction::Builtin(b) => builtin(&s, b, signals).await,
        StepAction::Command { run, cwd, env } => {
            let argv = match crate::config::substitute(run, s.job.target.as_deref(), &s.job.args) {
                Ok(argv) => argv,
                Err(e) => {
                    return StepEnd::Failed {
                        error: e,
                        retry: false,
                    };
                }
            };
            let mut all_env = s.env();
            all_env.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
            let workers = &s.ctx.config.workers;
            let spec = StepSpec {
                argv,
                cwd: cwd.clone(),
                env: all_env,
                timeout: s.timeout(),
                kill_grace: workers.kill_grace,
                safety_margin: workers.supervisor_margin(),
                initial_lease: workers.lease,
                log_file: s.ctx.opts.log_dir.join(format!("job-{}.log", s.job.id)),
                tail: s.tail.clone(),
            };
            command(spec, signals).await
        }
    }
}

async fn command(spec: StepSpec, signals: &mut UnboundedReceiver<JobSignal>) -> StepEnd {
    let handle = match executor::spawn(spec) {
        Ok(h) => h,
        Err(e) => {
            return StepEnd::Failed {
                error: e,
                retry: true,
            };
        }
    };
    let control = handle.control();
    let wait = handle.wait();
    tokio::pin!(wait);
    let mut engine_alive = true;
    loop {
        tokio::select! {
            end = &mut wait => return end,
            s = signals.recv(), if engine_alive => match s {
                Some(JobSignal::Deadline(left)) => control.feed_deadline(left),
                Some(JobSignal::Cancel) => control.stop(StopReason::Cancel),
                Some(JobSignal::LeaseLost) => control.stop(StopReason::LeaseLost),
                Some(JobSignal::Shutdown) => control.stop(StopReason::Shutdown),
                Some(JobSignal::Drain) => {}
                // The engine itself is gone: stop the step like a shutdown,
                // then only wait for it.
                None => {
                    engine_alive = false;
                    control.stop(StopReason::Shutdown);
                }
            }
        }
    }
}

async fn builtin(
    s: &StepContext<'_>,
    b: &Builtin,
    signals: &mut UnboundedReceiver<JobSignal>,
) -> StepEnd {
    match b {
        Builtin::Noop => StepEnd::Succeeded {
            checkpoints: Vec::new(),
        },
        Builtin::Fail { probability } => {
            s.tail
                .push_line(format!("{}: fail (p={probability})", s.step.name));
            random_failure(*probability)
        }
        Builtin::Sleep {
            duration,
            fail_probability,
        } => {
            s.tail.push_line(format!(
                "{}: sleep {}",
                s.step.name,
                humantime::format_duration(*duration)
            ));
            let timeout = s.timeout();
            let slept = match timeout {
                Some(t) if t < *duration => Err(t),
                _ => Ok(*duration),
            };
            let nap = slept.unwrap_or_else(|t| t);
            let sleep = tokio::time::sleep(nap);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    sig = signals.recv() => match sig {
                        Some(JobSignal::Cancel) => return StepEnd::Stopped(StopReason::Cancel),
                        Some(JobSignal::LeaseLost) => return StepEnd::Stopped(StopReason::LeaseLost),
                        Some(JobSignal::Shutdown) | None => return StepEnd::Stopped(StopReason::Shutdown),
                        Some(JobSignal::Deadline(_) | JobSignal::Drain) => {}
                    }
                }
            }
            match slept {
                Err(after) => StepEnd::TimedOut { after },
                Ok(_) => random_failure(*fail_probability),
            }
        }
        Builtin::Hang => hang(s, signals).await,
    }
}

fn random_failure(probability: f64) -> StepEnd {
    if probability > 0.0 && rand::random::<f64>() < probability {
        StepEnd::Failed {
            error: format!("simulated failure (probability {probability})"),
            retry: true,
        }
    } else {
        StepEnd::Succeeded {
            checkpoints: Vec::new(),
        }
    }
}

/// Behave like a frozen worker: stop renewing this job's lease and do
/// nothing until the lease must be considered lost; then write nothing,
/// exactly as the supervisor's fence would leave it.
async fn hang(s: &StepContext<'_>, signals: &mut UnboundedReceiver<JobSignal>) -> StepEnd {
    s.tail
        .push_line(format!("{}: hang (lease renewal stopped)", s.step.name));
    s.ctx.registry.stop_renewing(s.job.id);
    let lease_end = tokio::time::sleep(s.ctx.lease());
    tokio::pin!(lease_end);
    loop {
        tokio::select! {
            _ = &mut lease_end => return StepEnd::Fenced,
            sig = signals.recv() => match sig {
                // Frozen: cancel and drain are not heard; only a stopping
                // engine ends the wait (still writing nothing).
                Some(JobSignal::Shutdown) | None => return StepEnd::Fenced,
                Some(_) => {}
            }
        }
    }
}
