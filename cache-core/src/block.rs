//! Block math: which parts of which fixed-size blocks make up a byte range.

/// How objects are cut into fixed-size blocks. Block `i` of an object covers bytes
/// `[i * block_size, min((i + 1) * block_size, object_size))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    block_size: u64,
}

/// The part of one block that a byte range needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSlice {
    /// Index of the block within the object.
    pub index: u64,
    /// Offset of the block's first byte within the object.
    pub block_start: u64,
    /// Length of the whole block (shorter than the block size only for the last block).
    pub block_len: u64,
    /// First byte wanted, relative to the block start.
    pub from: u64,
    /// One past the last byte wanted, relative to the block start.
    pub to: u64,
    /// Size of the whole object the block was cut from: with the layout, it decides
    /// `block_len`, so a block's expected length is always known where it is read.
    pub object_size: u64,
}

impl BlockLayout {
    /// A layout with the given block size.
    ///
    /// # Panics
    /// If `block_size` is zero: a zero block size is a configuration error that must be rejected
    /// before it gets here.
    pub fn new(block_size: u64) -> Self {
        assert!(block_size > 0, "block size must be positive");
        Self { block_size }
    }

    /// The block size in bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Number of blocks an object of `object_size` bytes has.
    pub fn block_count(&self, object_size: u64) -> u64 {
        object_size.div_ceil(self.block_size)
    }

    /// The block with index `index` of an object of `object_size` bytes, whole.
    pub fn block(&self, index: u64, object_size: u64) -> Option<BlockSlice> {
        let block_start = index.checked_mul(self.block_size)?;
        if block_start >= object_size {
            return None;
        }
        let block_len = (object_size - block_start).min(self.block_size);
        Some(BlockSlice {
            index,
            block_start,
            block_len,
            from: 0,
            to: block_len,
            object_size,
        })
    }

    /// The slices of blocks that make up bytes `[start, end)` of an object of `object_size` bytes,
    /// in order. The range is clamped to the object; an empty range yields nothing.
    pub fn slices(
        &self,
        start: u64,
        end: u64,
        object_size: u64,
    ) -> impl Iterator<Item = BlockSlice> {
        let end = end.min(object_size);
        let layout = *self;
        let (first, last) = if start < end {
            (start / self.block_size, (end - 1) / self.block_size)
        } else {
            (1, 0)
        };
        (first..=last).filter_map(move |index| {
            let mut slice = layout.block(index, object_size)?;
            slice.from = start.saturating_sub(slice.block_start);
            slice.to = (end - slice.block_start).min(slice.block_len);
            Some(slice)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exact_blocks() {
        let layout = BlockLayout::new(10);
        assert_eq!(layout.block_count(0), 0);
        assert_eq!(layout.block_count(10), 1);
        assert_eq!(layout.block_count(11), 2);
        let s: Vec<_> = layout.slices(0, 10, 10).collect();
        assert_eq!(
            s,
            vec![BlockSlice {
                index: 0,
                block_start: 0,
                block_len: 10,
                from: 0,
                to: 10,
                object_size: 10
            }]
        );
        let s: Vec<_> = layout.slices(9, 11, 25).collect();
        assert_eq!(
            s,
            vec![
                BlockSlice {
                    index: 0,
                    block_start: 0,
                    block_len: 10,
                    from: 9,
                    to: 10,
                    object_size: 25
                },
                BlockSlice {
                    index: 1,
                    block_start: 10,
                    block_len: 10,
                    from: 0,
                    to: 1,
                    object_size: 25
                },
            ]
        );
        let s: Vec<_> = layout.slices(20, 100, 25).collect();
        assert_eq!(
            s,
            vec![BlockSlice {
                index: 2,
                block_start: 20,
                block_len: 5,
                from: 0,
                to: 5,
                object_size: 25
            }]
        );
        assert_eq!(layout.slices(5, 5, 25).count(), 0);
        assert_eq!(layout.slices(30, 40, 25).count(), 0);
        assert!(layout.block(3, 25).is_none());
    }

    proptest! {
        /// The slices tile the requested range exactly: contiguous, in order, inside their blocks.
        #[test]
        fn slices_tile_the_range(block_size in 1u64..5000, size in 0u64..100_000, a in 0u64..100_000, b in 0u64..100_000) {
            let layout = BlockLayout::new(block_size);
            let (start, end) = (a.min(b), a.max(b));
            let mut next = start;
            for s in layout.slices(start, end, size) {
                prop_assert_eq!(s.block_start, s.index * block_size);
                prop_assert!(s.block_len <= block_size && s.block_len > 0);
                prop_assert!(s.from < s.to && s.to <= s.block_len);
                prop_assert_eq!(s.block_start + s.from, next);
                prop_assert_eq!(Some(s.block_len), layout.block(s.index, size).map(|b| b.block_len));
                next = s.block_start + s.to;
            }
            let clamped_end = end.min(size);
            prop_assert_eq!(next, if start < clamped_end { clamped_end } else { start });
        }

        /// Whole blocks cover the object exactly once.
        #[test]
        fn blocks_cover_object(block_size in 1u64..5000, size in 0u64..100_000) {
            let layout = BlockLayout::new(block_size);
            let total: u64 = (0..layout.block_count(size)).map(|i| layout.block(i, size).map_or(0, |b| b.block_len)).sum();
            prop_assert_eq!(total, size);
            prop_assert!(layout.block(layout.block_count(size), size).is_none());
        }
    }
}
