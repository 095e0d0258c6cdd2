//! Byte ranges: the one type for the bytes a request asks of an object ([`ByteRange`], parsed
//! from a `Range` header or made by the read path to ask the upstream), and how S3 applies one
//! to an object once its size is known ([`Resolved`]).
//!
//! S3 serves a single byte range. What it does with anything else, which we follow:
//! - a header that is not a well-formed single `bytes=` range (multiple ranges, another unit,
//!   `bytes=5-2`, garbage) is ignored and the whole object is served with 200;
//! - a range starting at or past the end of the object (so any `bytes=a-b` or `bytes=a-` of an
//!   empty object) and `bytes=-0` are unsatisfiable: 416 InvalidRange with
//!   `Content-Range: bytes */<size>`;
//! - a suffix range `bytes=-n` of an empty object is the (empty) whole object, 200, as S3 answers
//!   (MinIO answers 206 with a malformed `Content-Range: bytes 0--1/0`);
//! - a range whose end lies past the object is cut at the last byte; a suffix longer than the
//!   object is the whole object, as 206.

use std::ops::Range;

/// The bytes asked of an object, not yet applied to its size: a parsed `Range` header, or what
/// the read path asks of the upstream before it knows the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `bytes=first-last` or `bytes=first-`.
    FromTo {
        /// First byte.
        first: u64,
        /// Last byte, inclusive; `None` for an open range.
        last: Option<u64>,
    },
    /// `bytes=-n`: the last `n` bytes.
    Suffix(u64),
}

/// What a request asks of an object once its size is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// The whole object, 200.
    Whole,
    /// Bytes `[start, end)`, 206.
    Partial {
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
    /// 416.
    Unsatisfiable,
}

impl ByteRange {
    /// Parse a `Range` header value. `None` means "ignore the header" (see the module docs).
    pub fn parse(value: &str) -> Option<ByteRange> {
        let spec = value.trim().strip_prefix("bytes=")?.trim();
        if spec.contains(',') {
            return None;
        }
        let (a, b) = spec.split_once('-')?;
        let (a, b) = (a.trim(), b.trim());
        let num = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        if a.is_empty() {
            return Some(ByteRange::Suffix(num(b)?));
        }
        let first = num(a)?;
        if b.is_empty() {
            return Some(ByteRange::FromTo { first, last: None });
        }
        let last = num(b)?;
        if last < first {
            return None;
        }
        Some(ByteRange::FromTo {
            first,
            last: Some(last),
        })
    }

    /// `[start, end)`, cut short at the object's end (`end` > `start`).
    pub fn bytes(range: Range<u64>) -> Self {
        ByteRange::FromTo {
            first: range.start,
            last: Some(range.end.saturating_sub(1).max(range.start)),
        }
    }

    /// The `Range` header asking for it.
    pub fn header(&self) -> String {
        match self {
            ByteRange::FromTo {
                first,
                last: Some(last),
            } => format!("bytes={first}-{last}"),
            ByteRange::FromTo { first, last: None } => format!("bytes={first}-"),
            ByteRange::Suffix(n) => format!("bytes=-{n}"),
        }
    }

    /// Its bytes within an object of `size` bytes (empty when it starts past the end).
    pub fn within(&self, size: u64) -> Range<u64> {
        match *self {
            ByteRange::FromTo { first, last } => {
                let end = last.map_or(size, |l| l.saturating_add(1).min(size));
                first.min(size)..end.max(first.min(size))
            }
            ByteRange::Suffix(n) => size.saturating_sub(n)..size,
        }
    }

    /// Apply to an object of `size` bytes, as S3 does.
    pub fn resolve(self, size: u64) -> Resolved {
        match self {
            ByteRange::FromTo { first, last } => {
                if first >= size {
                    return Resolved::Unsatisfiable;
                }
                let end = last.map_or(size, |l| l.saturating_add(1).min(size));
                Resolved::Partial { start: first, end }
            }
            ByteRange::Suffix(n) => {
                if n == 0 {
                    return Resolved::Unsatisfiable;
                }
                if size == 0 {
                    return Resolved::Whole;
                }
                Resolved::Partial {
                    start: size.saturating_sub(n),
                    end: size,
                }
            }
        }
    }
}

/// Resolve an optional `Range` header against an object size.
pub fn resolve(header: Option<&str>, size: u64) -> Resolved {
    resolve_parsed(header.and_then(ByteRange::parse), size)
}

/// Resolve a range parsed with [`ByteRange::parse`] (`None`: no header, or one S3 ignores).
pub fn resolve_parsed(range: Option<ByteRange>, size: u64) -> Resolved {
    range.map_or(Resolved::Whole, |r| r.resolve(size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(h: &str, size: u64) -> Resolved {
        resolve(Some(h), size)
    }

    #[test]
    fn the_forms_s3_accepts() {
        assert_eq!(r("bytes=0-9", 100), Resolved::Partial { start: 0, end: 10 });
        assert_eq!(
            r("bytes=90-", 100),
            Resolved::Partial {
                start: 90,
                end: 100
            }
        );
        assert_eq!(
            r("bytes=-10", 100),
            Resolved::Partial {
                start: 90,
                end: 100
            }
        );
        assert_eq!(
            r("bytes=99-99", 100),
            Resolved::Partial {
                start: 99,
                end: 100
            }
        );
        assert_eq!(
            r("bytes=50-1000", 100),
            Resolved::Partial {
                start: 50,
                end: 100
            }
        );
        assert_eq!(
            r("bytes=-1000", 100),
            Resolved::Partial { start: 0, end: 100 }
        );
        assert_eq!(r("bytes=0-0", 1), Resolved::Partial { start: 0, end: 1 });
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(r("bytes=100-", 100), Resolved::Unsatisfiable);
        assert_eq!(r("bytes=100-200", 100), Resolved::Unsatisfiable);
        assert_eq!(r("bytes=-0", 100), Resolved::Unsatisfiable);
        assert_eq!(r("bytes=0-", 0), Resolved::Unsatisfiable);
        assert_eq!(r("bytes=-0", 0), Resolved::Unsatisfiable);
        assert_eq!(r("bytes=-5", 0), Resolved::Whole);
    }

    #[test]
    fn ignored_headers_mean_the_whole_object() {
        for h in [
            "bytes=0-1,5-6",
            "items=0-1",
            "bytes=5-2",
            "bytes=a-b",
            "bytes=",
            "bytes=-",
            "bytes=+1-2",
            "0-10",
            "bytes=1-2-3",
        ] {
            assert_eq!(r(h, 100), Resolved::Whole, "{h}");
        }
        assert_eq!(resolve(None, 100), Resolved::Whole);
    }

    #[test]
    fn ranges_made_by_the_read_path_ask_what_they_cover() {
        assert_eq!(ByteRange::bytes(8..16).header(), "bytes=8-15");
        assert_eq!(ByteRange::Suffix(10).header(), "bytes=-10");
        assert_eq!(ByteRange::bytes(8..16).within(12), 8..12);
        assert_eq!(ByteRange::bytes(20..30).within(12), 12..12);
        assert_eq!(ByteRange::Suffix(10).within(4), 0..4);
        assert_eq!(ByteRange::parse("bytes=5-").unwrap().header(), "bytes=5-");
    }

    proptest! {
        #[test]
        fn partial_ranges_lie_inside_the_object(h in "bytes=[0-9]{0,4}-[0-9]{0,4}", size in 0u64..20_000) {
            if let Resolved::Partial { start, end } = r(&h, size) {
                prop_assert!(start < end && end <= size);
            }
        }

        #[test]
        fn explicit_ranges_resolve_exactly(first in 0u64..10_000, len in 1u64..10_000, size in 1u64..20_000) {
            let last = first + len - 1;
            let got = r(&format!("bytes={first}-{last}"), size);
            if first >= size {
                prop_assert_eq!(got, Resolved::Unsatisfiable);
            } else {
                prop_assert_eq!(got, Resolved::Partial { start: first, end: (last + 1).min(size) });
            }
        }

        #[test]
        fn parse_never_panics(h in ".{0,40}") {
            let _ = resolve(Some(&h), 1000);
        }
    }
}
