//! Group commit: the starts that did not happen with their claim (a lock
//! was busy) are queued here and written in one transaction per batch. A
//! batch gathers requests for at most `WINDOW` while more are expected
//! (other jobs of this node are in flight), so an idle engine adds no delay
//! and a busy one pays one commit for many jobs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::store::{Result, StoreError};

type Reply<T> = oneshot::Sender<Result<T>>;

/// Largest batch written in one transaction (keeps transactions short).
const MAX_BATCH: usize = 256;
/// How long a batch waits for the requests of jobs claimed or run together.
const WINDOW: Duration = Duration::from_millis(1);

#[derive(Debug)]
pub struct Batcher<Req, Resp> {
    queue: mpsc::UnboundedSender<(Req, Reply<Resp>)>,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Batcher {
            queue: self.queue.clone(),
        }
    }
}

impl<Req, Resp> Batcher<Req, Resp>
where
    Req: Clone + Send + Sync + 'static,
    Resp: Send + 'static,
{
    /// `write` commits a batch and answers per request, in order; an outer
    /// error (nothing written) is the answer of every request in the batch.
    /// `in_flight` says how many requests could still come (the jobs this
    /// node holds): a batch that has them all is written at once.
    pub fn new<F, Fut, N>(in_flight: N, write: F) -> Self
    where
        F: Fn(Arc<Vec<Req>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<Resp>>>> + Send,
        N: Fn() -> usize + Send + 'static,
    {
        let (queue, mut rx) = mpsc::unbounded_channel::<(Req, Reply<Resp>)>();
        tokio::spawn(async move {
            while let Some((req, reply)) = rx.recv().await {
                let mut reqs = vec![req];
                let mut replies = vec![reply];
                let deadline = tokio::time::Instant::now() + WINDOW;
                while reqs.len() < MAX_BATCH {
                    let next = match rx.try_recv() {
                        Ok(item) => Some(item),
                        Err(_) if reqs.len() >= in_flight() => None,
                        Err(_) => tokio::time::timeout_at(deadline, rx.recv())
                            .await
                            .ok()
                            .flatten(),
                    };
                    let Some((req, reply)) = next else { break };
                    reqs.push(req);
                    replies.push(reply);
                }
                tracing::trace!("writing a batch of {}", reqs.len());
                let reqs = Arc::new(reqs);
                match write(reqs.clone()).await {
                    Ok(answers) => {
                        for (reply, answer) in replies.into_iter().zip(answers) {
                            let _ = reply.send(answer);
                        }
                    }
                    Err(_) if replies.len() > 1 => {
                        let answers = write_alone(&reqs, &write).await;
                        for (reply, answer) in replies.into_iter().zip(answers) {
                            let _ = reply.send(answer);
                        }
                    }
                    Err(e) => {
                        for reply in replies {
                            let _ = reply.send(Err(e.clone()));
                        }
                    }
                }
            }
        });
        Batcher { queue }
    }

    /// Queue one request and wait for its answer.
    pub async fn call(&self, req: Req) -> Result<Resp> {
        let (tx, rx) = oneshot::channel();
        self.queue.send((req, tx)).map_err(|_| writer_stopped())?;
        rx.await.map_err(|_| writer_stopped())?
    }
}

/// The answer to a request whose writer task is gone (the engine stopped).
pub fn writer_stopped() -> StoreError {
    StoreError::Unreachable("the engine's writer has stopped".into())
}

/// After a batch failed as a whole: write each request alone, so only the
/// one at fault sees the error.
pub async fn write_alone<Req, Resp, F, Fut>(reqs: &[Req], write: F) -> Vec<Result<Resp>>
where
    Req: Clone,
    F: Fn(Arc<Vec<Req>>) -> Fut,
    Fut: Future<Output = Result<Vec<Result<Resp>>>>,
{
    let mut answers = Vec::with_capacity(reqs.len());
    for req in reqs {
        answers.push(match write(Arc::new(vec![req.clone()])).await {
            Ok(mut a) => a
                .pop()
                .unwrap_or_else(|| Err(StoreError::Database("empty batch answer".into()))),
            Err(e) => Err(e),
        });
    }
    answers
}
