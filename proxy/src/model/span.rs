//! The bytes a read asks of the upstream before the object's size is known.

use std::ops::Range;

/// The bytes a GET asks for before the object's size is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Span {
    /// `[start, end)`, cut short at the object's end.
    Bytes(Range<u64>),
    /// The last this many bytes (all of them in a smaller object).
    Last(u64),
}

impl Span {
    /// The `Range` header asking for it.
    pub fn header(&self) -> String {
        match self {
            Span::Bytes(r) => format!("bytes={}-{}", r.start, r.end.saturating_sub(1)),
            Span::Last(n) => format!("bytes=-{n}"),
        }
    }

    /// Its bytes within an object of `size` bytes.
    pub fn within(&self, size: u64) -> Range<u64> {
        match self {
            Span::Bytes(r) => r.start.min(size)..r.end.min(size),
            Span::Last(n) => size.saturating_sub(*n)..size,
        }
    }
}
