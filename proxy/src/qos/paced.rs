//! A response body sent no faster than its key's bytes a second.
//!
//! Each data frame is sent in slices of a tenth of a second's bytes at the key's rate (at least
//! 4 KiB, at most 1 MiB: [`Limits::slice`]), each a `Bytes` split, never a copy, and each
//! taken from the key's rate before it goes: within the burst at once, beyond it after the
//! wait the rate names. A cached block is one frame of up to `block_size`, so without slices a
//! slow key would get a whole block at once and then nothing for longer than an SDK's read
//! timeout (60 s in boto3: 8 MiB at 100 KiB/s is 80 s).
//!
//! Every body of the key takes from the same rate, so the key's responses together keep to
//! it, served in the order their slices were taken. The body holds one frame of its inner
//! body at most: a paced client is a slow reader, which the read path bounds already.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::Limits;

/// `inner`, sent at the rate of `limits`.
pub struct Paced<B> {
    inner: B,
    limits: Arc<Limits>,
    /// What is left of the inner body's last frame.
    rest: Bytes,
    /// A slice taken from the rate, sent when `wait` ends.
    held: Option<(Bytes, Pin<Box<Sleep>>)>,
}

impl<B> Paced<B> {
    /// `inner`, paced by `limits` (which must have a byte rate to pace anything).
    pub fn new(inner: B, limits: Arc<Limits>) -> Self {
        Self {
            inner,
            limits,
            rest: Bytes::new(),
            held: None,
        }
    }

    fn unsent(&self) -> u64 {
        let held = self.held.as_ref().map_or(0, |(b, _)| b.len());
        (self.rest.len() + held) as u64
    }
}

impl<B> Body for Paced<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some((_, wait)) = &mut this.held {
                ready!(wait.as_mut().poll(cx));
                let (slice, _) = this.held.take().expect("held");
                return Poll::Ready(Some(Ok(Frame::data(slice))));
            }
            if !this.rest.is_empty() {
                let slice = this.rest.split_to(this.limits.slice().min(this.rest.len()));
                // tokio's clock, so that a test's paused time paces as real time does.
                let now = tokio::time::Instant::now().into_std();
                let wait = this.limits.take_bytes(slice.len() as u64, now);
                if wait.is_zero() {
                    return Poll::Ready(Some(Ok(Frame::data(slice))));
                }
                this.held = Some((slice, Box::pin(tokio::time::sleep(wait))));
                continue;
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.unsent() == 0 && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let unsent = self.unsent();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + unsent);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + unsent);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::num::NonZeroU32;
    use std::time::Duration;

    fn limits(bytes_per_second: u64) -> Arc<Limits> {
        Arc::new(Limits::new(None::<NonZeroU32>, Some(bytes_per_second)).expect("a byte rate"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_is_sent_at_its_rate_in_slices_with_its_length_known() {
        // 1 MiB at 256 KiB/s, a tenth of a second's burst: about 4 s.
        let body = Paced::new(
            Full::new(Bytes::from(vec![7u8; 1 << 20])),
            limits(256 << 10),
        );
        assert_eq!(body.size_hint().exact(), Some(1 << 20));
        let started = tokio::time::Instant::now();
        let mut body = body;
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= 26_214);
            got.extend_from_slice(&data);
        }
        assert_eq!(got, vec![7u8; 1 << 20]);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(3800) && took <= Duration::from_millis(4100),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn two_bodies_of_one_key_share_its_rate() {
        let limits = limits(512 << 10);
        let read = |limits: Arc<Limits>| async move {
            let chunks = (0..8).map(|_| {
                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![1u8; 128 << 10])))
            });
            let body = Paced::new(StreamBody::new(futures::stream::iter(chunks)), limits);
            body.collect().await.unwrap().to_bytes().len()
        };
        let started = tokio::time::Instant::now();
        let (a, b) = tokio::join!(read(limits.clone()), read(limits.clone()));
        assert_eq!((a, b), (1 << 20, 1 << 20));
        // 2 MiB at 512 KiB/s.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(3800) && took <= Duration::from_millis(4100),
            "{took:?}"
        );
        assert!(limits.paced_seconds() > 3.0);
    }
}
