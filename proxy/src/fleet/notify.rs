//! Telling the other replicas what one learnt:
//! - that an object changed: a write through one replica, or an S3 event received by one,
//!   reaches every replica, so none keeps serving what it cached of the old version for the
//!   rest of its TTL;
//! - where a part of a multipart upload lies, as the upstream answered one replica's
//!   pass-through of a `partNumber` read: every replica then reads that part from the fleet's
//!   blocks, where each would otherwise pass its own first read of it through, the part's bytes
//!   leaving the upstream once per replica.
//!
//! Notices wait in a bounded queue ([`QUEUE`]) and are sent by one task, several at a time;
//! a notice that finds the queue full is dropped and counted (`dropped`), and a peer that
//! cannot be told is counted (`failed`): either way that peer falls back on what it did
//! before: its TTLs, the staleness bound it had (a change), or its own pass-through of the
//! part's first read (a part). A peer that restarts has nothing cached to drop.

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Fleet;
use crate::model::{ObjectId, PartNumber, PartSpan};
use crate::telemetry::labels::NoticeOutcome;

/// Notices waiting to be told, at most.
pub const QUEUE: usize = 4096;

/// Notices told at once.
const CONCURRENCY: usize = 16;

/// What to tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// An object (or a bucket) changed.
    Changed(ChangeNotice),
    /// Where part `part` of `object` lies, as the upstream said.
    Part {
        /// The object (and version) the part is of.
        object: ObjectId,
        /// The part's number.
        part: PartNumber,
        /// Where it lies, in the object of that ETag and size.
        span: Arc<PartSpan>,
    },
}

/// A change to tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeNotice {
    /// The bucket.
    pub bucket: Arc<str>,
    /// The key; `None`: any key of the bucket may have changed.
    pub key: Option<Arc<str>>,
    /// Learnt from an S3 event: a replica told of it knows the event stream is alive, though
    /// the bucket notifies only one replica.
    pub from_event: bool,
}

/// The queue's two ends.
pub(super) fn queue() -> (mpsc::Sender<Notice>, mpsc::Receiver<Notice>) {
    mpsc::channel(QUEUE)
}

impl Fleet {
    /// Tell every other replica about `notice`, without waiting.
    pub fn notify(&self, notice: Notice) {
        if self.notices.try_send(notice).is_err() {
            self.metrics.notice(NoticeOutcome::Dropped);
        }
    }

    /// Send queued changes until `shutdown`. Started once.
    pub async fn tell_peers(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(receiver) = self.pending_notices.lock().take() else {
            return;
        };
        let notices = tokio_stream_from(receiver);
        let told = notices
            .map(|notice| {
                let fleet = self.clone();
                async move { fleet.tell(&notice).await }
            })
            .buffer_unordered(CONCURRENCY)
            .for_each(|()| async {});
        tokio::select! {
            () = told => {}
            () = shutdown.cancelled() => {}
        }
    }

    async fn tell(&self, notice: &Notice) {
        let view = self.view();
        let me = view.me().to_owned();
        let peers = view
            .members()
            .iter()
            .filter(|m| *m.name != *me)
            .map(|m| m.name.clone());
        let sends = peers.map(|peer| async move {
            let result = match notice {
                Notice::Changed(change) => self.client.changed(&peer, change).await,
                Notice::Part { object, part, span } => {
                    self.client.part(&peer, object, *part, span).await
                }
            };
            if let Err(e) = &result {
                tracing::debug!(%peer, error = %e, "could not tell a peer what this replica learnt");
            }
            self.metrics.notice(match result {
                Ok(()) => NoticeOutcome::Sent,
                Err(_) => NoticeOutcome::Failed,
            });
        });
        futures::future::join_all(sends).await;
    }
}

fn tokio_stream_from(mut receiver: mpsc::Receiver<Notice>) -> impl futures::Stream<Item = Notice> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}
