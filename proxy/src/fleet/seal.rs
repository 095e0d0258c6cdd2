//! Peer answers, authenticated piece by piece.
//!
//! A peer request is signed ([`super::auth`]); its answer must be too, or anyone who can reach
//! a replica's peer client (a spoofed DNS member, a box on the path of cleartext h2c) could feed
//! it bytes it would serve and cache. An owner therefore sends its answer body as frames,
//! `[length: u32 BE][HMAC-SHA256: 32 bytes][data]`, each MAC bound to the secret, the request's
//! own signature and the frame's sequence number ([`PeerSecret::answer_mac`]). The asker checks
//! each frame before releasing a byte of it, so whatever reaches a reader or the cache is what
//! the owner sent, and a body that breaks mid-way leaves only verified bytes behind (the
//! upstream can take over from there). Frames are at most [`MAX_FRAME`] long, so a piece is
//! held back at most that much before it is released.
//!
//! Error answers (a JSON body, not framed) carry the MAC of their whole body in [`MAC_HEADER`].

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{self, BoxStream, Stream, StreamExt};

use super::auth::PeerSecret;
use crate::model::UpstreamError;

/// Largest frame an owner sends: an 8 MiB block goes as 32 frames.
pub const MAX_FRAME: usize = 256 * 1024;
/// The header carrying the hex MAC of a non-framed (error) answer body.
pub const MAC_HEADER: &str = "x-larder-peer-mac";
/// Sequence number of an error body's MAC: never a frame's.
pub const ERROR_SEQ: u64 = u64::MAX;
const HEAD: usize = 4 + 32;

/// The owner's side: `body` as authenticated frames for the request signed by `request`.
pub fn seal<S>(
    secret: PeerSecret,
    request: String,
    body: S,
) -> impl Stream<Item = Result<Bytes, UpstreamError>>
where
    S: Stream<Item = Result<Bytes, UpstreamError>> + Send + 'static,
{
    let mut seq = 0u64;
    body.flat_map(move |chunk| {
        let pieces: Vec<Result<Bytes, UpstreamError>> = match chunk {
            Err(e) => vec![Err(e)],
            Ok(data) => {
                let mut out = Vec::new();
                let mut rest = data;
                while !rest.is_empty() {
                    let piece = rest.split_to(rest.len().min(MAX_FRAME));
                    let mut head = BytesMut::with_capacity(HEAD);
                    head.extend_from_slice(&(piece.len() as u32).to_be_bytes());
                    head.extend_from_slice(&secret.answer_mac(&request, seq, &piece));
                    seq += 1;
                    out.push(Ok(head.freeze()));
                    // The data itself is sent as it is: no copy.
                    out.push(Ok(piece));
                }
                out
            }
        };
        stream::iter(pieces)
    })
}

/// The asker's side: the verified data of a framed `body` answering the request signed by
/// `request`. A frame that does not verify, or a body that ends inside a frame, ends the
/// stream with an error after the last verified byte.
pub fn unseal(
    secret: PeerSecret,
    request: String,
    body: BoxStream<'static, Result<Bytes, UpstreamError>>,
) -> BoxStream<'static, Result<Bytes, UpstreamError>> {
    struct State {
        secret: PeerSecret,
        request: String,
        body: BoxStream<'static, Result<Bytes, UpstreamError>>,
        buf: BytesMut,
        seq: u64,
        done: bool,
    }
    let state = State {
        secret,
        request,
        body,
        buf: BytesMut::new(),
        seq: 0,
        done: false,
    };
    stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            if st.buf.len() >= HEAD {
                let len = u32::from_be_bytes([st.buf[0], st.buf[1], st.buf[2], st.buf[3]]) as usize;
                if len == 0 || len > MAX_FRAME {
                    st.done = true;
                    return Some((Err(forged("a frame of impossible length")), st));
                }
                if st.buf.len() >= HEAD + len {
                    let mac: [u8; 32] = st.buf[4..HEAD].try_into().unwrap_or([0; 32]);
                    st.buf.advance(HEAD);
                    let data = st.buf.split_to(len).freeze();
                    if !st.secret.verify_answer(&st.request, st.seq, &data, &mac) {
                        st.done = true;
                        return Some((Err(forged("a frame that does not verify")), st));
                    }
                    st.seq += 1;
                    return Some((Ok(data), st));
                }
            }
            match st.body.next().await {
                Some(Ok(chunk)) => st.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                None if st.buf.is_empty() => return None,
                None => {
                    st.done = true;
                    return Some((
                        Err(UpstreamError::Transport(
                            "peer body ended inside a frame".into(),
                        )),
                        st,
                    ));
                }
            }
        }
    })
    .boxed()
}

fn forged(what: &str) -> UpstreamError {
    tracing::warn!(what, "a peer answer failed its authentication");
    UpstreamError::Transport(format!("peer answer refused: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &[u8]) -> PeerSecret {
        PeerSecret::new(s).unwrap()
    }

    async fn through(
        sealed: Vec<Bytes>,
        with: &PeerSecret,
        request: &str,
    ) -> (Vec<u8>, Option<UpstreamError>) {
        let body = stream::iter(sealed.into_iter().map(Ok)).boxed();
        let mut out = unseal(with.clone(), request.into(), body);
        let mut got = Vec::new();
        while let Some(r) = out.next().await {
            match r {
                Ok(b) => got.extend_from_slice(&b),
                Err(e) => return (got, Some(e)),
            }
        }
        (got, None)
    }

    async fn sealed(s: &PeerSecret, request: &str, chunks: &[&[u8]]) -> Vec<Bytes> {
        let body = stream::iter(
            chunks
                .iter()
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect::<Vec<_>>(),
        );
        let framed: Vec<_> = seal(s.clone(), request.into(), body).collect().await;
        // Re-cut the wire bytes anywhere: framing must not depend on how they arrive.
        let wire: Vec<u8> = framed
            .into_iter()
            .flat_map(|b| b.unwrap().to_vec())
            .collect();
        wire.chunks(1000).map(Bytes::copy_from_slice).collect()
    }

    #[tokio::test]
    async fn an_answer_from_the_owner_arrives_whole_and_verified() {
        let s = secret(b"the-fleet-secret-of-some-length");
        let big = vec![7u8; 3 * MAX_FRAME + 5];
        let wire = sealed(&s, "req-1", &[b"hello ", &big, b"end"]).await;
        let (got, err) = through(wire, &s, "req-1").await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got.len(), 6 + big.len() + 3);
        assert_eq!(&got[..6], b"hello ");
    }

    #[tokio::test]
    async fn forged_replayed_or_altered_answers_release_no_unverified_byte() {
        let s = secret(b"the-fleet-secret-of-some-length");
        let wire = sealed(&s, "req-1", &[b"first", b"second"]).await;
        // Another secret, another request (a replayed answer): nothing released.
        let (got, err) = through(
            wire.clone(),
            &secret(b"some-other-secret-entirely"),
            "req-1",
        )
        .await;
        assert!(got.is_empty() && err.is_some());
        let (got, err) = through(wire.clone(), &s, "req-2").await;
        assert!(got.is_empty() && err.is_some());
        // A flipped byte in the second frame: only the first frame's bytes are released.
        let mut flat: Vec<u8> = wire.iter().flat_map(|b| b.to_vec()).collect();
        let last = flat.len() - 1;
        flat[last] ^= 1;
        let (got, err) = through(vec![Bytes::from(flat.clone())], &s, "req-1").await;
        assert_eq!(got, b"first");
        assert!(err.is_some());
        // Cut inside a frame: the verified prefix, then an error.
        flat[last] ^= 1;
        flat.truncate(last);
        let (got, err) = through(vec![Bytes::from(flat)], &s, "req-1").await;
        assert_eq!(got, b"first");
        assert!(err.is_some());
        // Unframed bytes (a peer that does not seal): refused.
        let (got, err) = through(vec![Bytes::from(vec![0xffu8; 100])], &s, "req-1").await;
        assert!(got.is_empty() && err.is_some());
    }
}
