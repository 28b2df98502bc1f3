//! The engine's cycle: the finishes of the jobs that just ended and the
//! claim (and start) of the jobs that take their slots, written in one
//! transaction. A slot is free again once its job's step is over, so the
//! finish and the next claim share a commit: one commit per cycle instead
//! of a claim, a start and a finish per batch.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::batch::{write_alone, writer_stopped};
use super::runtime::Ctx;
use crate::job::State;
use crate::store::{ClaimRequest, Claimed, CycleOutcome, CycleRequest, LeaseRef, Outcome, Result};

/// How long a cycle waits for the finishes of jobs that ran together.
const WINDOW: Duration = Duration::from_millis(1);

/// A job's request to be finished in the next cycle.
#[derive(Debug)]
pub struct Finish {
    lease: LeaseRef,
    outcome: Outcome,
    reply: oneshot::Sender<Result<State>>,
}

/// Where job tasks hand in their finishes; the main loop reads them.
#[derive(Debug, Clone)]
pub struct FinishQueue(mpsc::UnboundedSender<Finish>);

pub type FinishReceiver = mpsc::UnboundedReceiver<Finish>;

impl FinishQueue {
    pub fn new() -> (Self, FinishReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        (FinishQueue(tx), rx)
    }

    /// Finish the job in the next cycle and wait for its answer.
    pub async fn call(&self, lease: LeaseRef, outcome: Outcome) -> Result<State> {
        let (reply, answer) = oneshot::channel();
        self.0
            .send(Finish {
                lease,
                outcome,
                reply,
            })
            .map_err(|_| writer_stopped())?;
        answer.await.map_err(|_| writer_stopped())?
    }
}

/// Take the finishes waiting now and, when there are some, those that
/// arrive within `WINDOW` while other jobs of this node may still end.
pub async fn gather(ctx: &Ctx, rx: &mut FinishReceiver, finishes: &mut Vec<Finish>) {
    while let Ok(f) = rx.try_recv() {
        finishes.push(f);
    }
    if finishes.is_empty() {
        return;
    }
    let deadline = tokio::time::Instant::now() + WINDOW;
    while finishes.len() < ctx.registry.len() {
        // A yield lets jobs that ended together hand in their finishes
        // before the timer is involved at all.
        tokio::task::yield_now().await;
        if let Ok(f) = rx.try_recv() {
            finishes.push(f);
            continue;
        }
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(f)) => finishes.push(f),
            _ => return,
        }
    }
}

/// Write one cycle: `finishes` and, when `claim` is set, a claim of up to
/// its limit. Answers every finish; returns the claimed jobs. When the
/// cycle fails as a whole, its parts are written on their own so that one
/// bad job cannot stall the others: the finishes (one by one if need be),
/// then the claim without starts (each claimed job then starts through the
/// per-job path, where a start that fails stays that job's problem).
pub async fn write(
    ctx: &Arc<Ctx>,
    finishes: Vec<Finish>,
    claim: Option<ClaimRequest>,
) -> Result<Vec<Claimed>> {
    let req = CycleRequest {
        finishes: finishes
            .iter()
            .map(|f| (f.lease, f.outcome.clone()))
            .collect(),
        claim,
        specs: ctx.start_specs(),
    };
    let e = match ctx.store.cycle(&req, &ctx.worker_id).await {
        Ok(CycleOutcome { finished, claimed }) => {
            answer(ctx, finishes, finished);
            return Ok(claimed);
        }
        Err(e) => e,
    };
    tracing::debug!("cycle: {e}; writing its parts on their own");
    if !finishes.is_empty() {
        let items = req.finishes;
        let answers = match ctx.store.finish_many(&items, &ctx.worker_id).await {
            Ok(a) => a,
            Err(_) => {
                write_alone(&items, |one| {
                    let store = ctx.store.clone();
                    let worker = ctx.worker_id.clone();
                    async move { store.finish_many(&one, &worker).await }
                })
                .await
            }
        };
        answer(ctx, finishes, answers);
    }
    match req.claim {
        None => Ok(Vec::new()),
        Some(claim) => {
            let alone = CycleRequest {
                claim: Some(claim),
                ..CycleRequest::default()
            };
            Ok(ctx.store.cycle(&alone, &ctx.worker_id).await?.claimed)
        }
    }
}

/// Reply to each finish; a job whose finish is settled no longer takes a
/// slot (its task removes it too, a moment later).
fn answer(ctx: &Ctx, finishes: Vec<Finish>, answers: Vec<Result<State>>) {
    for (f, a) in finishes.into_iter().zip(answers) {
        if !matches!(&a, Err(e) if e.is_transient()) {
            ctx.registry.remove(f.lease.id);
        }
        let _ = f.reply.send(a);
    }
}
