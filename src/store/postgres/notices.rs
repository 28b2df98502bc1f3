//! LISTEN/NOTIFY as the engine's stream of wake-ups.

use futures::StreamExt;
use sqlx::postgres::{PgListener, PgNotification};

use super::CANCEL_CHANNEL;
use crate::store::{Notice, NoticeStream};

fn notice(n: &PgNotification) -> Option<Notice> {
    if n.channel() == CANCEL_CHANNEL {
        // A payload that is not an id came from someone else: ignore it.
        n.payload().parse().ok().map(Notice::CancelRequested)
    } else {
        Some(Notice::JobsAvailable)
    }
}

/// Built on `try_recv`, which answers `Ok(None)` once it has replaced a lost
/// connection: whatever was sent meanwhile is gone, so that becomes a
/// `JobsAvailable` (claim now). Missed cancel requests still reach the
/// worker through its next lease renewal. An error ends nothing: the
/// caller decides whether to drop the stream and listen again.
pub(super) fn stream(listener: PgListener) -> NoticeStream {
    futures::stream::unfold(listener, |mut listener| async move {
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    if let Some(notice) = notice(&n) {
                        return Some((Ok(notice), listener));
                    }
                }
                Ok(None) => return Some((Ok(Notice::JobsAvailable), listener)),
                Err(e) => return Some((Err(e.into()), listener)),
            }
        }
    })
    .boxed()
}
