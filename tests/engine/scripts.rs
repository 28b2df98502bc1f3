//! Config pieces and step scripts shared by the tests. Scripts report to
//! the ledger (`$LEDGER`), one `>>` write per line.

use std::time::Duration;

use crate::harness::{Env, eventually};

/// Records `pid JOB ATTEMPT PID NS`; on attempt 1 of a job whose arg `hang`
/// is `yes` it then sleeps (as the same pid) until stopped; otherwise it
/// records `done JOB ATTEMPT` and succeeds.
pub const HANG_ONCE: &str = r#"
echo "pid $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $$ $(date +%s%N)" >> "$LEDGER"
if [ "$JOBDECK_ARG_HANG" = yes ] && [ "$JOBDECK_ATTEMPT" = 1 ]; then exec sleep 60; fi
echo "done $JOBDECK_JOB_ID $JOBDECK_ATTEMPT" >> "$LEDGER"
"#;

/// `[workers]` with the given lease; kill grace short so stops are quick.
pub fn workers(lease: &str, extra: &str) -> String {
    format!("[workers]\nlease = \"{lease}\"\nkill_grace = \"1s\"\n{extra}\n")
}

/// A one-step pipeline running `script` under `sh -c`, retrying after 100 ms.
pub fn pipeline(name: &str, settings: &str, script: &str) -> String {
    format!(
        "[[pipeline]]\nname = \"{name}\"\nbackoff = \"100ms\"\n{settings}\n\
         [[pipeline.step]]\nname = \"work\"\nrun = [\"sh\", \"-c\", '''{script}''']\n"
    )
}

/// The pid job `id` recorded on `attempt`, once it has.
pub async fn step_pid(env: &Env, id: i64, attempt: i64) -> i32 {
    let attempt = attempt.to_string();
    eventually(
        &format!("job {id} attempt {attempt} to start its step"),
        Duration::from_secs(20),
        async || {
            env.ledger_of("pid", id)
                .into_iter()
                .find(|l| l.get(2) == Some(&attempt))
                .and_then(|l| l.get(3)?.parse().ok())
        },
    )
    .await
}

/// How many `word` lines job `id` left in the ledger.
pub fn count(env: &Env, word: &str, id: i64) -> usize {
    env.ledger_of(word, id).len()
}

/// Waits until every pid is gone; panics naming the survivors after `within`.
pub async fn all_gone(pids: &[i32], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let alive: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| crate::harness::alive(*p))
            .collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "step processes {alive:?} still alive after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
