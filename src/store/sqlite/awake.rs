//! Waiting for the cycle's query without parking the thread. The query
//! comes back from sqlx's SQLite connection thread as a stream of about
//! 25 items for a cycle of 8 jobs (each statement's rows, then its
//! result). Awaited the usual way, the runtime thread parks between them
//! and each arrival wakes it: a write to the runtime's eventfd, a context
//! switch and, on a virtual machine, a halted vCPU woken again; `perf`
//! put a quarter of the engine's time in those wake-ups. Polling the
//! stream with a no-op waker and yielding to the runtime in between keeps
//! the thread busy for as long as a cycle usually takes (1.2–1.4× the
//! jobs/s in alternating runs); past [`SPIN`] the stream is awaited as
//! usual. The query is sent once this process holds the file's write lock
//! (`write_lock.rs`), so the spin covers its own work, not a wait for
//! another jobdeck process; a writer that is not jobdeck may still make it
//! wait, and the spin then gives up.
//!
//! Postgres does not do this: its cycle runs in the server, which shares
//! the machine's cores, and a spinning client took a core the server's
//! backend needed. The pickup of a job enqueued by another process went
//! from p95 0.43 ms to 2.03 ms, the length of the spin (bench/HISTORY.md,
//! session 13).

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

/// How long a cycle's query is polled before its stream is awaited with a
/// real waker: a few times what a cycle's query takes (about 0.5 ms).
pub(super) const SPIN: Duration = Duration::from_millis(2);

/// Every item of `stream` until its end or its first error, polled without
/// parking for up to [`SPIN`], then awaited.
pub(super) async fn collect_awake<T, E, S>(stream: S) -> Result<Vec<T>, E>
where
    S: Stream<Item = Result<T, E>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut out = Vec::new();
    let started = Instant::now();
    loop {
        match poll_without_waker(stream.as_mut()) {
            Poll::Ready(Some(item)) => out.push(item?),
            Poll::Ready(None) => return Ok(out),
            Poll::Pending if started.elapsed() < SPIN => tokio::task::yield_now().await,
            Poll::Pending => break,
        }
    }
    while let Some(item) = stream.next().await {
        out.push(item?);
    }
    Ok(out)
}

/// One poll whose waker does nothing: the caller polls again itself.
fn poll_without_waker<S: Stream>(stream: Pin<&mut S>) -> Poll<Option<S::Item>> {
    stream.poll_next(&mut Context::from_waker(Waker::noop()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn receiver_stream(
        rx: mpsc::Receiver<Result<u32, String>>,
    ) -> impl Stream<Item = Result<u32, String>> {
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
    }

    #[tokio::test]
    async fn collects_every_item_in_order() {
        let items = futures::stream::iter((0..100).map(Ok::<u32, String>));
        assert_eq!(
            collect_awake(items).await.unwrap(),
            (0..100).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn stops_at_the_first_error() {
        let items = futures::stream::iter(vec![Ok(1), Err("boom".to_string()), Ok(3)]);
        assert_eq!(collect_awake(items).await, Err("boom".to_string()));
    }

    // Items sent from another thread, one while the stream is polled and
    // the rest long after SPIN: they arrive (a waker that never fired would
    // hang the collection), and past SPIN the stream is polled only when
    // woken, not thousands of times by a spin that never ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_the_spin_the_stream_is_awaited() {
        let (tx, rx) = mpsc::channel(4);
        let sender = std::thread::spawn(move || {
            tx.blocking_send(Ok(1)).unwrap();
            std::thread::sleep(SPIN * 10);
            tx.blocking_send(Ok(2)).unwrap();
            std::thread::sleep(SPIN * 10);
            tx.blocking_send(Ok(3)).unwrap();
        });
        let started = Instant::now();
        let polls = std::sync::Mutex::new(Vec::new());
        let counted = futures::stream::poll_fn({
            let mut inner = Box::pin(receiver_stream(rx));
            let polls = &polls;
            move |cx| {
                polls.lock().unwrap().push(started.elapsed());
                inner.as_mut().poll_next(cx)
            }
        });
        let collected = tokio::time::timeout(Duration::from_secs(10), collect_awake(counted))
            .await
            .expect("items sent after the spin were never collected");
        assert_eq!(collected.unwrap(), vec![1, 2, 3]);
        sender.join().unwrap();
        let late = polls
            .lock()
            .unwrap()
            .iter()
            .filter(|t| **t > SPIN * 3)
            .count();
        assert!(late <= 10, "{late} polls after the spin");
    }
}
