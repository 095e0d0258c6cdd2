//! Decoding `aws-chunked` upload bodies whose chunks are signed, verifying each signature as the
//! bytes stream through.
//!
//! Each chunk is `hex-size;chunk-signature=<sig>\r\n<data>\r\n`; a zero-size chunk ends the data,
//! followed by signed trailing headers (the `-TRAILER` variant) and an empty line. Data is passed
//! on as it arrives, except the last byte of each chunk, which is held back until the chunk's
//! signature verifies: the upstream request carries the decoded length, so it can never complete
//! with bytes whose signature failed.
//!
//! A body with trailing checksum headers goes upstream re-framed as an unsigned `aws-chunked`
//! body (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`) in chunks of [`FRAME`] bytes, with the client's
//! checksum in its trailer, so the upstream still checks and stores it. Its length is known
//! before the first byte ([`framed_length`]), and its last bytes, the trailer, are sent only once
//! the trailer's signature has verified.

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};

use super::sigv4::ChunkSigner;

/// Longest chunk header or trailer line accepted.
const MAX_LINE: usize = 4096;
/// Most bytes of trailing headers accepted.
const MAX_TRAILER: usize = 16 * 1024;

/// Size of the chunks a re-framed body is sent upstream in.
pub const FRAME: usize = 64 * 1024;

/// Length of the base64 value of a trailing checksum header, by name.
fn trailer_value_len(name: &str) -> Option<usize> {
    match name {
        "x-amz-checksum-crc32" | "x-amz-checksum-crc32c" => Some(8),
        "x-amz-checksum-crc64nvme" => Some(12),
        "x-amz-checksum-sha1" => Some(28),
        "x-amz-checksum-sha256" => Some(44),
        _ => None,
    }
}

/// The trailer names an `x-amz-trailer` header announces, if Larder can re-frame them.
pub fn trailer_names(header: &str) -> Option<Vec<String>> {
    let names: Vec<String> = header
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    names
        .iter()
        .all(|n| trailer_value_len(n).is_some())
        .then_some(names)
}

/// Bytes of the re-framed body for `decoded` bytes of data and these trailers.
pub fn framed_length(decoded: u64, trailers: &[String]) -> u64 {
    let frame = |size: u64| format!("{size:x}").len() as u64 + 2 + size + 2;
    let full = decoded / FRAME as u64;
    let rest = decoded % FRAME as u64;
    let mut total = full * frame(FRAME as u64) + if rest > 0 { frame(rest) } else { 0 };
    total += 3; // "0\r\n"
    for name in trailers {
        total += (name.len() + 1 + trailer_value_len(name).unwrap_or(0) + 2) as u64;
    }
    total + 2
}

/// Re-framing state: data waiting for a full frame, and the trailers to send.
struct Reframe {
    buf: BytesMut,
    trailers: Vec<String>,
}

impl Reframe {
    fn push(&mut self, mut data: Bytes, out: &mut Vec<Bytes>) {
        while !data.is_empty() {
            let take = (FRAME - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data.split_to(take));
            if self.buf.len() == FRAME {
                self.flush(out);
            }
        }
    }

    fn flush(&mut self, out: &mut Vec<Bytes>) {
        if self.buf.is_empty() {
            return;
        }
        let data = self.buf.split().freeze();
        out.push(Bytes::from(format!("{:x}\r\n", data.len())));
        out.push(data);
        out.push(Bytes::from_static(b"\r\n"));
    }
}

/// Why a chunked body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// The framing is broken.
    #[error("the aws-chunked body is malformed: {0}")]
    Framing(&'static str),
    /// A chunk or trailer signature did not verify.
    #[error("a chunk signature does not match")]
    Signature,
    /// The decoded length differs from `x-amz-decoded-content-length`.
    #[error("the body holds {got} bytes, x-amz-decoded-content-length says {expected}")]
    Length {
        /// Bytes decoded.
        got: u64,
        /// Bytes announced.
        expected: u64,
    },
    /// The client's body failed.
    #[error("the request body broke off: {0}")]
    Body(String),
}

enum State {
    /// Reading a chunk header line.
    Header,
    /// Inside a chunk's data, with this many bytes left.
    Data(u64),
    /// Expecting the `\r\n` after a chunk's data.
    DataEnd,
    /// Reading trailing header lines.
    Trailer,
    /// Expecting the final empty line (no trailer).
    Final,
    /// Done.
    Done,
}

/// A push parser: feed it the body as it arrives, take out decoded data.
pub struct Decoder {
    state: State,
    line: BytesMut,
    signer: Option<ChunkSigner>,
    trailer: bool,
    trailers: Vec<(String, String)>,
    trailer_bytes: usize,
    chunk_signature: Option<String>,
    hasher: Sha256,
    held: Option<Bytes>,
    decoded: u64,
    expected: u64,
    reframe: Option<Reframe>,
    trailer_verified: bool,
}

impl Decoder {
    /// A decoder for a body of `expected` decoded bytes; `signer` verifies signatures (`None`:
    /// framing only), `trailer`: trailing headers follow the data.
    pub fn new(signer: Option<ChunkSigner>, trailer: bool, expected: u64) -> Self {
        Self {
            state: State::Header,
            line: BytesMut::new(),
            signer,
            trailer,
            trailers: Vec::new(),
            trailer_bytes: 0,
            chunk_signature: None,
            hasher: Sha256::new(),
            held: None,
            decoded: 0,
            expected,
            reframe: None,
            trailer_verified: false,
        }
    }

    /// Emit the data re-framed as an unsigned `aws-chunked` body ending in `trailers` (which
    /// [`trailer_names`] accepted), instead of bare.
    pub fn reframed(mut self, trailers: Vec<String>) -> Self {
        self.reframe = Some(Reframe {
            buf: BytesMut::with_capacity(FRAME),
            trailers,
        });
        self
    }

    fn emit(&mut self, data: Bytes, out: &mut Vec<Bytes>) {
        if data.is_empty() {
            return;
        }
        match &mut self.reframe {
            Some(r) => r.push(data, out),
            None => out.push(data),
        }
    }

    /// Consume `input`, appending decoded data to `out`.
    pub fn push(&mut self, mut input: Bytes, out: &mut Vec<Bytes>) -> Result<(), ChunkError> {
        while !input.is_empty() {
            match self.state {
                State::Data(left) => {
                    let take = (input.len() as u64).min(left) as usize;
                    let data = input.split_to(take);
                    self.hasher.update(&data);
                    let left = left - take as u64;
                    self.state = State::Data(left);
                    if left == 0 {
                        self.state = State::DataEnd;
                        if self.signer.is_some() {
                            // Hold back the chunk's last byte until its signature verifies.
                            let mut data = data;
                            let last = data.split_off(data.len() - 1);
                            self.held = Some(last);
                            self.emit(data, out);
                            continue;
                        }
                    }
                    self.emit(data, out);
                }
                State::Header | State::Trailer | State::DataEnd | State::Final => {
                    let Some(line) = self.take_line(&mut input)? else {
                        continue;
                    };
                    self.line_done(line, out)?;
                }
                State::Done => return Err(ChunkError::Framing("bytes after the end")),
            }
        }
        Ok(())
    }

    /// The body ended: check it was complete.
    pub fn finish(&self) -> Result<(), ChunkError> {
        if !matches!(self.state, State::Done) {
            return Err(ChunkError::Framing("the body ended inside a chunk"));
        }
        if self.decoded != self.expected {
            return Err(ChunkError::Length {
                got: self.decoded,
                expected: self.expected,
            });
        }
        Ok(())
    }

    /// Trailing headers received (the signature line excluded).
    pub fn trailers(&self) -> &[(String, String)] {
        &self.trailers
    }

    /// Accumulate up to the next `\r\n`; the line without it once complete.
    fn take_line(&mut self, input: &mut Bytes) -> Result<Option<Bytes>, ChunkError> {
        match input.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.line.extend_from_slice(&input[..=i]);
                input.advance(i + 1);
                let mut line = self.line.split().freeze();
                if line.len() < 2 || line[line.len() - 2] != b'\r' {
                    return Err(ChunkError::Framing("lines must end in CRLF"));
                }
                line.truncate(line.len() - 2);
                Ok(Some(line))
            }
            None => {
                self.line.extend_from_slice(input);
                input.clear();
                if self.line.len() > MAX_LINE {
                    return Err(ChunkError::Framing("a line is too long"));
                }
                Ok(None)
            }
        }
    }

    fn line_done(&mut self, line: Bytes, out: &mut Vec<Bytes>) -> Result<(), ChunkError> {
        match self.state {
            State::Header => {
                let text = std::str::from_utf8(&line)
                    .map_err(|_| ChunkError::Framing("a chunk header is not ASCII"))?;
                let (size, ext) = match text.split_once(';') {
                    Some((s, e)) => (s, Some(e)),
                    None => (text, None),
                };
                if size.is_empty() || size.len() > 16 {
                    return Err(ChunkError::Framing("bad chunk size"));
                }
                let size = u64::from_str_radix(size, 16)
                    .map_err(|_| ChunkError::Framing("bad chunk size"))?;
                self.chunk_signature = match ext {
                    Some(e) => Some(
                        e.strip_prefix("chunk-signature=")
                            .ok_or(ChunkError::Framing("unknown chunk extension"))?
                            .to_owned(),
                    ),
                    None => None,
                };
                if self.signer.is_some() && self.chunk_signature.is_none() {
                    return Err(ChunkError::Framing("a chunk has no signature"));
                }
                // Checked: a size near u64::MAX must not wrap the count back under the
                // announced length (found by the `chunked` fuzz target).
                self.decoded = match self.decoded.checked_add(size) {
                    Some(total) if total <= self.expected => total,
                    _ => {
                        return Err(ChunkError::Length {
                            got: self.decoded.saturating_add(size),
                            expected: self.expected,
                        })
                    }
                };
                self.hasher = Sha256::new();
                if size == 0 {
                    self.verify_chunk()?;
                    self.state = if self.trailer {
                        State::Trailer
                    } else {
                        State::Final
                    };
                } else {
                    self.state = State::Data(size);
                }
            }
            State::DataEnd => {
                if !line.is_empty() {
                    return Err(ChunkError::Framing("chunk data is longer than its size"));
                }
                self.verify_chunk()?;
                if let Some(held) = self.held.take() {
                    self.emit(held, out);
                }
                self.state = State::Header;
            }
            State::Final => {
                if !line.is_empty() {
                    return Err(ChunkError::Framing("expected the final empty line"));
                }
                self.state = State::Done;
                return self.end_frame(out);
            }
            State::Trailer => {
                if line.is_empty() {
                    if self.signer.is_some() && !self.trailer_verified {
                        return Err(ChunkError::Framing("the trailer has no signature"));
                    }
                    self.state = State::Done;
                    return self.end_frame(out);
                }
                self.trailer_bytes += line.len();
                if self.trailer_bytes > MAX_TRAILER {
                    return Err(ChunkError::Framing("trailing headers are too large"));
                }
                let text = std::str::from_utf8(&line)
                    .map_err(|_| ChunkError::Framing("a trailing header is not ASCII"))?;
                let (name, value) = text
                    .split_once(':')
                    .ok_or(ChunkError::Framing("a trailing header has no ':'"))?;
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_owned());
                if name == "x-amz-trailer-signature" {
                    self.verify_trailer(&value)?;
                } else {
                    self.trailers.push((name, value));
                }
            }
            State::Data(_) | State::Done => unreachable!("lines are read only between chunks"),
        }
        Ok(())
    }

    /// After the last line: the rest of a re-framed body, its trailer last.
    fn end_frame(&mut self, out: &mut Vec<Bytes>) -> Result<(), ChunkError> {
        if self.decoded != self.expected {
            return Err(ChunkError::Length {
                got: self.decoded,
                expected: self.expected,
            });
        }
        let Some(reframe) = &mut self.reframe else {
            return Ok(());
        };
        reframe.flush(out);
        let mut end = String::from("0\r\n");
        for name in &reframe.trailers {
            let value = self
                .trailers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .ok_or(ChunkError::Framing("an announced trailer is missing"))?;
            if Some(value.len()) != trailer_value_len(name) {
                return Err(ChunkError::Framing(
                    "a trailing checksum has the wrong length",
                ));
            }
            end.push_str(&format!("{name}:{value}\r\n"));
        }
        end.push_str("\r\n");
        out.push(Bytes::from(end));
        Ok(())
    }

    fn verify_chunk(&mut self) -> Result<(), ChunkError> {
        let Some(signer) = &mut self.signer else {
            return Ok(());
        };
        let hash = hex::encode(std::mem::take(&mut self.hasher).finalize());
        let signature = self.chunk_signature.take().unwrap_or_default();
        if signer.verify_chunk(&hash, &signature) {
            Ok(())
        } else {
            Err(ChunkError::Signature)
        }
    }

    fn verify_trailer(&mut self, signature: &str) -> Result<(), ChunkError> {
        let Some(signer) = &mut self.signer else {
            return Ok(());
        };
        let mut sorted = self.trailers.clone();
        sorted.sort();
        let mut canonical = String::new();
        for (name, value) in &sorted {
            canonical.push_str(&format!("{name}:{value}\n"));
        }
        let hash = hex::encode(Sha256::digest(canonical.as_bytes()));
        if signer.verify_trailer(&hash, signature) {
            self.trailer_verified = true;
            Ok(())
        } else {
            Err(ChunkError::Signature)
        }
    }
}

/// Decode a whole body stream. The stream ends with an error if the body is malformed, fails a
/// signature, or has the wrong length.
pub fn decode<S, E>(
    body: S,
    decoder: Decoder,
) -> impl Stream<Item = Result<Bytes, ChunkError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    futures::stream::unfold((body, Some(decoder)), |(mut body, decoder)| async move {
        let mut decoder = decoder?;
        loop {
            match body.next().await {
                Some(Ok(input)) => {
                    let mut out = Vec::new();
                    if let Err(e) = decoder.push(input, &mut out) {
                        return Some((vec![Err(e)], (body, None)));
                    }
                    if !out.is_empty() {
                        let out = out.into_iter().map(Ok).collect();
                        return Some((out, (body, Some(decoder))));
                    }
                }
                Some(Err(e)) => {
                    return Some((vec![Err(ChunkError::Body(e.to_string()))], (body, None)))
                }
                None => {
                    return match decoder.finish() {
                        Ok(()) => None,
                        Err(e) => Some((vec![Err(e)], (body, None))),
                    }
                }
            }
        }
    })
    .flat_map(futures::stream::iter)
}

#[cfg(test)]
mod tests {

    use super::*;

    fn frame(chunks: &[&[u8]], trailer: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n");
        if let Some(t) = trailer {
            out.extend_from_slice(t.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    fn run(body: &[u8], piece: usize, trailer: bool, expected: u64) -> Result<Vec<u8>, ChunkError> {
        let mut d = Decoder::new(None, trailer, expected);
        let mut out = Vec::new();
        for p in body.chunks(piece) {
            d.push(Bytes::copy_from_slice(p), &mut out)?;
        }
        d.finish()?;
        Ok(out.concat())
    }

    #[test]
    fn decodes_at_any_split() {
        let body = frame(&[b"hello ", b"world"], None);
        for piece in 1..body.len() {
            assert_eq!(run(&body, piece, false, 11).unwrap(), b"hello world");
        }
        let body = frame(&[b"abc"], Some("x-amz-checksum-crc32:AAAAAA==\r\n"));
        let mut d = Decoder::new(None, true, 3);
        let mut out = Vec::new();
        d.push(Bytes::from(body), &mut out).unwrap();
        d.finish().unwrap();
        assert_eq!(
            d.trailers(),
            &[("x-amz-checksum-crc32".to_owned(), "AAAAAA==".to_owned())]
        );
    }

    #[test]
    fn reframes_with_the_trailer_last_and_the_announced_length() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let client = frame(
            &[&data[..70_000], &data[70_000..]],
            Some("x-amz-checksum-crc32:AAAAAA==\r\n"),
        );
        let names = trailer_names("x-amz-checksum-crc32").unwrap();
        let mut d = Decoder::new(None, true, data.len() as u64).reframed(names.clone());
        let mut out = Vec::new();
        for piece in client.chunks(777) {
            d.push(Bytes::copy_from_slice(piece), &mut out).unwrap();
        }
        d.finish().unwrap();
        let framed = out.concat();
        assert_eq!(
            framed.len() as u64,
            framed_length(data.len() as u64, &names)
        );
        assert!(framed.ends_with(b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"));
        // Framed again in 64 KiB chunks, it decodes to the same data.
        let mut again = Decoder::new(None, true, data.len() as u64);
        let mut plain = Vec::new();
        again.push(Bytes::from(framed), &mut plain).unwrap();
        again.finish().unwrap();
        assert_eq!(plain.concat(), data);
        assert!(trailer_names("x-amz-checksum-md7").is_none());
        // A trailer value of the wrong length is refused rather than sent.
        let bad = frame(&[b"abc"], Some("x-amz-checksum-crc32:AAAA\r\n"));
        let mut d =
            Decoder::new(None, true, 3).reframed(trailer_names("x-amz-checksum-crc32").unwrap());
        assert!(d.push(Bytes::from(bad), &mut Vec::new()).is_err());
    }

    #[test]
    fn refuses_broken_framing_and_lengths() {
        let good = frame(&[b"hello"], None);
        assert!(matches!(
            run(&good, 3, false, 4),
            Err(ChunkError::Length { .. })
        ));
        assert!(matches!(
            run(&good, 3, false, 6),
            Err(ChunkError::Length { .. })
        ));
        assert!(run(&good[..good.len() - 2], 3, false, 5).is_err());
        for bad in [
            b"5\r\nhello!\r\n0\r\n\r\n".as_slice(),
            b"zz\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5;foo=bar\r\nhello\r\n0\r\n\r\n",
            b"0\r\n\r\nextra",
        ] {
            assert!(
                matches!(
                    run(bad, 4, false, 5),
                    Err(ChunkError::Framing(_)) | Err(ChunkError::Length { .. })
                ),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'1'; MAX_LINE + 10];
        assert!(run(&long, 100, false, 5).is_err());
    }

    #[test]
    fn a_chunk_size_that_would_wrap_the_decoded_count_is_refused() {
        // 16 bytes, then a size that adds up to 2^64: wrapped, the count would be 0 again and
        // the huge chunk would pass as within the announced length.
        let body = b"10\r\n0123456789abcdef\r\nfffffffffffffff0\r\nmore\r\n0\r\n\r\n";
        assert!(matches!(
            run(body, 7, false, 100),
            Err(ChunkError::Length { .. })
        ));
    }
}
