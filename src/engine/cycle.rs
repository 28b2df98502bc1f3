//! The engine's cycle: the finishes of the jobs that just ended and the
//! claim (and start) of the jobs that take their slots, written in one
//! transaction. A slot is free again once its job's step is over, so the
//! finish and the next claim share a commit: one commit per cycle instead
//! of a claim, a start and a finish per batch. With `[workers]
//! cycles_in_flight` above one, where the database runs them side by side,
//! more than one cycle is in flight ([`InFlight`]): while one waits on the
//! server, the engine sends the next. One is the default: a cycle's fixed
//! cost (round trip, function call, commit) then carries all the slots.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::task::{self, JoinError, JoinSet};

use super::batch::{write_alone, writer_stopped};
use super::runtime::Ctx;
use crate::job::State;
use crate::store::{
    ClaimRequest, Claimed, CycleOutcome, CycleRequest, LeaseRef, Outcome, Result, StoreError,
};

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
/// arrive within `WINDOW` while others of the `expected` may still come.
pub async fn gather(rx: &mut FinishReceiver, finishes: &mut Vec<Finish>, expected: usize) {
    while let Ok(f) = rx.try_recv() {
        finishes.push(f);
    }
    if finishes.is_empty() {
        return;
    }
    let deadline = tokio::time::Instant::now() + WINDOW;
    while finishes.len() < expected {
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

/// A cycle's answer: the claimed jobs, and the claim's limit.
#[derive(Debug)]
pub struct Settled {
    pub limit: usize,
    pub claimed: Result<Vec<Claimed>>,
}

/// A cycle in flight: the jobs whose finishes it writes and its claim's
/// limit. Its finishes and its claim meet at its commit, so until it is
/// answered it holds the more of the two.
#[derive(Debug)]
struct Sent {
    finishing: Vec<i64>,
    limit: usize,
}

impl Sent {
    fn holds(&self) -> usize {
        self.finishing.len().max(self.limit)
    }
}

/// The cycles a node has sent and not yet heard back from, and the slots
/// they hold, so that the database never shows more jobs running on a
/// node than it has slots.
#[derive(Debug)]
pub struct InFlight {
    cycles: JoinSet<Result<Vec<Claimed>>>,
    sent: HashMap<task::Id, Sent>,
    most: usize,
    /// Until when [`InFlight::settled`] polls instead of sleeping: the
    /// last send plus `[workers] busy_poll`.
    busy_until: Option<Instant>,
}

impl InFlight {
    pub fn new(most: usize) -> Self {
        InFlight {
            cycles: JoinSet::new(),
            sent: HashMap::new(),
            most: most.max(1),
            busy_until: None,
        }
    }

    pub fn has_room(&self) -> bool {
        self.cycles.len() < self.most
    }

    pub fn is_empty(&self) -> bool {
        self.cycles.is_empty()
    }

    /// The jobs this node runs whose finishes no cycle in flight writes:
    /// those that may still hand one in. A cycle's task drops its jobs
    /// from the registry when answered, before the main loop hears the
    /// cycle is over, so they are told apart by id, not counted.
    pub fn running(&self, ctx: &Ctx) -> usize {
        ctx.registry
            .count_unless(|id| self.sent.values().any(|c| c.finishing.contains(&id)))
    }

    /// Slots held by cycles in flight.
    pub fn holding(&self) -> usize {
        self.sent.values().map(Sent::holds).sum()
    }

    /// The claim for a cycle sent now with `finishing` finishes: the slots
    /// neither held by a running job nor by a cycle in flight, plus those
    /// of the jobs it finishes. With room for several cycles, each claims
    /// its share of the slots, so that the slots settle into groups that
    /// cycle in turn. `None` when there is nothing to claim.
    pub fn claim_request(&self, ctx: &Ctx, finishing: usize) -> Option<ClaimRequest> {
        let slots = ctx.slots();
        let running = self.running(ctx).saturating_sub(finishing);
        let free = slots.saturating_sub(running + self.holding());
        let limit = free.min(slots.div_ceil(self.most));
        if limit == 0 || ctx.config.pipelines.is_empty() {
            return None;
        }
        Some(ClaimRequest {
            worker: ctx.worker_id.clone(),
            pipelines: ctx.config.pipeline_names(),
            limit,
            lease: ctx.lease(),
        })
    }

    /// Write `finishes` and `claim` in a cycle of its own task.
    pub fn send(&mut self, ctx: &Arc<Ctx>, finishes: Vec<Finish>, claim: Option<ClaimRequest>) {
        let busy_poll = ctx.config.workers.busy_poll;
        self.busy_until = (!busy_poll.is_zero()).then(|| Instant::now() + busy_poll);
        let sent = Sent {
            finishing: finishes.iter().map(|f| f.lease.id).collect(),
            limit: claim.as_ref().map_or(0, |c| c.limit),
        };
        let ctx = ctx.clone();
        let handle = self
            .cycles
            .spawn(async move { write(&ctx, finishes, claim).await });
        self.sent.insert(handle.id(), sent);
    }

    /// The next cycle to answer; pending while none is in flight. For
    /// `[workers] busy_poll` after a send the thread looks for the answer
    /// without going to sleep: a sleeping thread's wake-up is a sizeable
    /// part of a short cycle (bench/HISTORY.md, session 33).
    pub async fn settled(&mut self) -> Settled {
        if let Some(until) = self.busy_until {
            while !self.is_empty() && Instant::now() < until {
                if let Some(s) = self.try_settled() {
                    return s;
                }
                // Yielding lets the runtime poll its sockets (without
                // blocking) before it polls this task again.
                task::yield_now().await;
            }
        }
        match self.cycles.join_next_with_id().await {
            Some(joined) => self.account(joined),
            None => std::future::pending().await,
        }
    }

    /// A cycle that has answered already, if any.
    pub fn try_settled(&mut self) -> Option<Settled> {
        let joined = self.cycles.try_join_next_with_id()?;
        Some(self.account(joined))
    }

    fn account(
        &mut self,
        joined: std::result::Result<(task::Id, Result<Vec<Claimed>>), JoinError>,
    ) -> Settled {
        let (id, claimed) = match joined {
            Ok((id, claimed)) => (id, claimed),
            // Its finishes' answers were dropped with it: their jobs see
            // the writer stopped, as they would had the loop itself died.
            Err(e) => (e.id(), Err(StoreError::Invalid(format!("cycle task: {e}")))),
        };
        let limit = self.sent.remove(&id).map_or(0, |c| c.limit);
        Settled { limit, claimed }
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
