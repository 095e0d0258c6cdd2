//! The on-disk format, byte for byte. `docs/disk-format.md` describes the same layout for humans;
//! change both together and bump [`FORMAT_VERSION`] whenever an old reader could misread new bytes.
//!
//! Every structure carries a magic, the format version and a CRC32C over its own bytes, so a torn
//! write, a stale region or a foreign file reads as "not there", never as data.

use thiserror::Error;

use super::sealing::{DataKey, EntryCipher, CHECK_LEN, SALT_LEN, TAG_LEN, WRAPPED_LEN};

/// The unit of every I/O and every on-disk offset.
pub(crate) const PAGE: usize = 4096;
// Entries are written from `AlignedBuf`s: their alignment must be a whole page.
const _: () = assert!(crate::buffers::ALIGN.is_multiple_of(PAGE));
/// Values are checksummed in chunks of this size, so a range read verifies only what it reads.
pub(crate) const CHUNK: usize = 64 * 1024;
/// Version of everything below. A reader refuses (or, if told to, reformats) any other version.
/// 2: an entry's value follows its header directly instead of starting on the next page.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// Where region 0 starts. The first MiB holds the superblock; keeping regions 1 MiB-aligned
/// suits raw devices and RAID stripes.
pub(crate) const DATA_START: u64 = 1 << 20;
/// Largest region: an index record holds page offsets and lengths in 16 bits.
pub(crate) const MAX_REGION_SIZE: u64 = (1 << 16) * PAGE as u64;
/// Longest key an entry can hold.
pub(crate) const MAX_KEY_LEN: usize = 2048;
/// Longest partition name.
pub(crate) const MAX_PARTITION_NAME: usize = 32;
/// Most partitions a superblock can describe.
pub(crate) const MAX_PARTITIONS: usize = 64;

const SUPER_MAGIC: &[u8; 8] = b"LARDERDC";
const REGION_MAGIC: u32 = u32::from_le_bytes(*b"LRGN");
const ENTRY_MAGIC: u32 = u32::from_le_bytes(*b"LENT");
/// A sealed (encrypted) entry: a reader of another build sees a magic it does not know, so it
/// never takes ciphertext for a value.
const SEALED_MAGIC: u32 = u32::from_le_bytes(*b"LENC");
/// Where the superblock keeps its key check: the 16 bytes before its CRC, zeros (what every
/// superblock written before encryption holds there) when the device is not sealed.
const SUPER_CHECK_AT: usize = PAGE - 4 - CHECK_LEN;
// The check comes after the largest partition table.
/// Where it keeps the data key wrapped (zeros: none, the configured key is the data key).
const SUPER_WRAP_AT: usize = SUPER_CHECK_AT - WRAPPED_LEN;
const _: () = assert!(36 + MAX_PARTITIONS * (1 + MAX_PARTITION_NAME + 8) <= SUPER_WRAP_AT);
const ENTRY_FIXED: usize = 32;
const REGION_HEADER_LEN: usize = 40;
/// Bytes per region-summary record: key hash, page offset, page length.
pub(crate) const SUMMARY_RECORD: usize = 16;

/// Why bytes read from the device are not a valid structure.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FormatError {
    /// No structure of this kind was ever written here (or it was overwritten).
    #[error("bad magic")]
    Magic,
    /// Written by another format version.
    #[error("format version {found}, this build reads {FORMAT_VERSION}")]
    Version {
        /// The version found on disk.
        found: u32,
    },
    /// The bytes do not match their checksum: a torn write or media corruption.
    #[error("checksum mismatch")]
    Checksum,
    /// A length or offset field is impossible.
    #[error("malformed: {0}")]
    Malformed(&'static str),
    /// A sealed entry where the cache has no key, or a plain one where it seals every entry.
    #[error("sealed or not against the configuration")]
    Sealing,
}

pub(crate) fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// One named slice of the device's regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionExtent {
    pub(crate) name: String,
    pub(crate) first_region: u32,
    pub(crate) regions: u32,
}

/// The first page of the device: its geometry and the cache generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub(crate) region_size: u64,
    /// Bumping it empties the cache lazily: regions of another generation read as free.
    pub(crate) generation: u64,
    pub(crate) partitions: Vec<PartitionExtent>,
    /// The check value of the key every entry is sealed with ([`DataKey::check`]), zeros if
    /// entries are not sealed.
    pub(crate) sealing: [u8; CHECK_LEN],
    /// That key wrapped under the configured key ([`super::sealing::DeviceKey::wrap`]); zeros
    /// on a plain device, and on one sealed under the configured key itself (written before
    /// data keys were wrapped).
    pub(crate) wrapped: [u8; WRAPPED_LEN],
}

impl Superblock {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        b[0..8].copy_from_slice(SUPER_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(PAGE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.region_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..36].copy_from_slice(&(self.partitions.len() as u32).to_le_bytes());
        let mut at = 36;
        for p in &self.partitions {
            let name = p.name.as_bytes();
            b[at] = name.len() as u8;
            b[at + 1..at + 1 + name.len()].copy_from_slice(name);
            at += 1 + MAX_PARTITION_NAME;
            b[at..at + 4].copy_from_slice(&p.first_region.to_le_bytes());
            b[at + 4..at + 8].copy_from_slice(&p.regions.to_le_bytes());
            at += 8;
        }
        b[SUPER_CHECK_AT..SUPER_CHECK_AT + CHECK_LEN].copy_from_slice(&self.sealing);
        b[SUPER_WRAP_AT..SUPER_WRAP_AT + WRAPPED_LEN].copy_from_slice(&self.wrapped);
        let crc = crc32c::crc32c(&b[..PAGE - 4]);
        b[PAGE - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < PAGE || &b[0..8] != SUPER_MAGIC {
            return Err(FormatError::Magic);
        }
        // The version is checked before the checksum: another version may checksum differently,
        // and "written by version N" is the more useful error.
        let version = u32_at(b, 8);
        if version != FORMAT_VERSION {
            return Err(FormatError::Version { found: version });
        }
        if crc32c::crc32c(&b[..PAGE - 4]) != u32_at(b, PAGE - 4) {
            return Err(FormatError::Checksum);
        }
        if u32_at(b, 12) as usize != PAGE {
            return Err(FormatError::Malformed("page size"));
        }
        let count = u32_at(b, 32) as usize;
        if count > MAX_PARTITIONS {
            return Err(FormatError::Malformed("partition count"));
        }
        let mut partitions = Vec::with_capacity(count);
        let mut at = 36;
        for _ in 0..count {
            let len = b[at] as usize;
            if len > MAX_PARTITION_NAME {
                return Err(FormatError::Malformed("partition name"));
            }
            let name = std::str::from_utf8(&b[at + 1..at + 1 + len])
                .map_err(|_| FormatError::Malformed("partition name"))?
                .to_owned();
            at += 1 + MAX_PARTITION_NAME;
            partitions.push(PartitionExtent {
                name,
                first_region: u32_at(b, at),
                regions: u32_at(b, at + 4),
            });
            at += 8;
        }
        let mut sealing = [0u8; CHECK_LEN];
        sealing.copy_from_slice(&b[SUPER_CHECK_AT..SUPER_CHECK_AT + CHECK_LEN]);
        let mut wrapped = [0u8; WRAPPED_LEN];
        wrapped.copy_from_slice(&b[SUPER_WRAP_AT..SUPER_WRAP_AT + WRAPPED_LEN]);
        Ok(Self {
            region_size: u64_at(b, 16),
            generation: u64_at(b, 24),
            partitions,
            sealing,
            wrapped,
        })
    }
}

/// The first page of a region: which write epoch it holds and, once sealed, where its summary is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegionHeader {
    pub(crate) generation: u64,
    /// Unique, increasing per activation of any region: orders regions for FIFO eviction and
    /// tells this use of the region from every earlier one.
    pub(crate) epoch: u64,
    /// Byte offset of the summary within the region, 0 while the region is open.
    pub(crate) summary_offset: u32,
    pub(crate) summary_entries: u32,
    pub(crate) summary_crc: u32,
}

impl RegionHeader {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        b[0..4].copy_from_slice(&REGION_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        b[24..28].copy_from_slice(&self.summary_offset.to_le_bytes());
        b[28..32].copy_from_slice(&self.summary_entries.to_le_bytes());
        b[32..36].copy_from_slice(&self.summary_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < REGION_HEADER_LEN || u32_at(b, 0) != REGION_MAGIC {
            return Err(FormatError::Magic);
        }
        let version = u32_at(b, 4);
        if version != FORMAT_VERSION {
            return Err(FormatError::Version { found: version });
        }
        if crc32c::crc32c(&b[..36]) != u32_at(b, 36) {
            return Err(FormatError::Checksum);
        }
        Ok(Self {
            generation: u64_at(b, 8),
            epoch: u64_at(b, 16),
            summary_offset: u32_at(b, 24),
            summary_entries: u32_at(b, 28),
            summary_crc: u32_at(b, 32),
        })
    }
}

/// One record of a region summary: enough to rebuild the index without reading the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SummaryRecord {
    pub(crate) hash: u64,
    pub(crate) page: u32,
    pub(crate) pages: u32,
}

pub(crate) fn encode_summary(records: &[SummaryRecord]) -> (Vec<u8>, u32) {
    let len = round_up((records.len() * SUMMARY_RECORD) as u64, PAGE as u64).max(PAGE as u64);
    let mut b = vec![0u8; len as usize];
    for (i, r) in records.iter().enumerate() {
        let at = i * SUMMARY_RECORD;
        b[at..at + 8].copy_from_slice(&r.hash.to_le_bytes());
        b[at + 8..at + 12].copy_from_slice(&r.page.to_le_bytes());
        b[at + 12..at + 16].copy_from_slice(&r.pages.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..records.len() * SUMMARY_RECORD]);
    (b, crc)
}

pub(crate) fn decode_summary(
    b: &[u8],
    entries: u32,
    crc: u32,
) -> Result<Vec<SummaryRecord>, FormatError> {
    let len = entries as usize * SUMMARY_RECORD;
    if b.len() < len {
        return Err(FormatError::Malformed("summary length"));
    }
    if crc32c::crc32c(&b[..len]) != crc {
        return Err(FormatError::Checksum);
    }
    Ok((0..entries as usize)
        .map(|i| {
            let at = i * SUMMARY_RECORD;
            SummaryRecord {
                hash: u64_at(b, at),
                page: u32_at(b, at + 8),
                pages: u32_at(b, at + 12),
            }
        })
        .collect())
}

/// Bytes a summary of `entries` records occupies on disk.
pub(crate) fn summary_len(entries: usize) -> u64 {
    round_up((entries * SUMMARY_RECORD) as u64, PAGE as u64).max(PAGE as u64)
}

/// Where an entry's parts lie, computed from its key and value lengths and whether it is
/// sealed.
///
/// A plain entry's header: the fixed part, the key, a CRC32C per value chunk, its own CRC32C.
/// A sealed entry's header: the fixed part, the salt, the encrypted key and its tag, a tag per
/// value chunk, its own CRC32C (which tells a torn write from an attack before any decryption).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryLayout {
    /// Bytes of the header; the value follows at once, so a small value shares its page with
    /// the header and costs its size, not a page more.
    pub(crate) header_len: usize,
    pub(crate) value_len: usize,
    pub(crate) sealed: bool,
}

impl EntryLayout {
    pub(crate) fn new(key_len: usize, value_len: usize, sealed: bool) -> Self {
        let chunks = value_len.div_ceil(CHUNK);
        let header_len = if sealed {
            ENTRY_FIXED + SALT_LEN + key_len + TAG_LEN + TAG_LEN * chunks + 4
        } else {
            ENTRY_FIXED + key_len + 4 * chunks + 4
        };
        Self {
            header_len,
            value_len,
            sealed,
        }
    }

    /// Bytes the entry occupies on disk: header and value, padded to a page.
    pub(crate) fn total_len(&self) -> usize {
        round_up((self.header_len + self.value_len) as u64, PAGE as u64) as usize
    }

    pub(crate) fn chunks(&self) -> usize {
        self.value_len.div_ceil(CHUNK)
    }

    /// Bytes of each chunk's check: a CRC32C, or a tag.
    fn check_len(&self) -> usize {
        if self.sealed {
            TAG_LEN
        } else {
            4
        }
    }

    /// Where the key (encrypted if sealed) starts in the header.
    fn key_at(&self) -> usize {
        ENTRY_FIXED + if self.sealed { SALT_LEN } else { 0 }
    }

    /// Where the chunk checks start, after the key (and its tag if sealed).
    fn checks_at(&self, key_len: usize) -> usize {
        self.key_at() + key_len + if self.sealed { TAG_LEN } else { 0 }
    }
}

/// Write an entry (header, key, per-chunk checks, value) into `out`, which is `total_len` long,
/// sealing it with `sealing` when given. Every byte of `out` is written, the padding with zeros:
/// `out` may be a reused buffer holding another entry's bytes, which must not reach the device.
pub(crate) fn encode_entry(
    out: &mut [u8],
    epoch: u64,
    key: &[u8],
    value: &[u8],
    sealing: Option<&DataKey>,
) {
    let layout = EntryLayout::new(key.len(), value.len(), sealing.is_some());
    let (h, rest) = out.split_at_mut(layout.header_len);
    let magic = if layout.sealed {
        SEALED_MAGIC
    } else {
        ENTRY_MAGIC
    };
    h[0..4].copy_from_slice(&magic.to_le_bytes());
    h[4..6].copy_from_slice(&(FORMAT_VERSION as u16).to_le_bytes());
    h[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
    h[8..16].copy_from_slice(&epoch.to_le_bytes());
    h[16..24].copy_from_slice(&(value.len() as u64).to_le_bytes());
    h[24..28].copy_from_slice(&(layout.header_len as u32).to_le_bytes());
    h[28..ENTRY_FIXED].fill(0);
    let key_at = layout.key_at();
    h[key_at..key_at + key.len()].copy_from_slice(key);
    let (value_out, padding) = rest.split_at_mut(value.len());
    value_out.copy_from_slice(value);
    padding.fill(0);
    let mut at = layout.checks_at(key.len());
    match sealing {
        None => {
            for chunk in value.chunks(CHUNK) {
                h[at..at + 4].copy_from_slice(&crc32c::crc32c(chunk).to_le_bytes());
                at += 4;
            }
        }
        Some(device) => {
            let salt = DataKey::salt();
            h[ENTRY_FIXED..key_at].copy_from_slice(&salt);
            let cipher = device.entry(&salt);
            let len = value.len() as u64;
            let key_tag = cipher.seal_key(len, &mut h[key_at..key_at + key.len()]);
            h[at - TAG_LEN..at].copy_from_slice(&key_tag);
            for (i, chunk) in value_out.chunks_mut(CHUNK).enumerate() {
                let tag = cipher.seal_chunk(i as u32, len, chunk);
                h[at..at + TAG_LEN].copy_from_slice(&tag);
                at += TAG_LEN;
            }
        }
    }
    let crc = crc32c::crc32c(&h[..at]);
    h[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A parsed, checksum-verified entry header; if sealed, its key decrypted and its cipher ready
/// to open the value's chunks.
#[derive(Debug, Clone)]
pub(crate) struct EntryHeader {
    pub(crate) epoch: u64,
    pub(crate) layout: EntryLayout,
    key: Key,
    checks_at: usize,
}

/// Where an entry's cache key is: in the header read from disk, or (sealed) decrypted.
#[derive(Debug, Clone)]
enum Key {
    InHeader {
        at: usize,
        len: usize,
    },
    Opened {
        key: Box<[u8]>,
        cipher: std::sync::Arc<EntryCipher>,
    },
}

impl EntryHeader {
    /// Bytes to read from the entry's start to decode its header (whole pages), known from the
    /// first page alone.
    pub(crate) fn peek_len(first_page: &[u8]) -> Result<usize, FormatError> {
        if first_page.len() < ENTRY_FIXED
            || !matches!(u32_at(first_page, 0), ENTRY_MAGIC | SEALED_MAGIC)
        {
            return Err(FormatError::Magic);
        }
        let len = u32_at(first_page, 24) as usize;
        if len <= ENTRY_FIXED || len > 64 * PAGE {
            return Err(FormatError::Malformed("header length"));
        }
        Ok(round_up(len as u64, PAGE as u64) as usize)
    }

    /// Decode and check the header at the start of `b`. A cache given `sealing` reads sealed
    /// entries only, and one without reads plain entries only: bytes written under another
    /// configuration (or planted) are never taken for a value.
    pub(crate) fn decode(b: &[u8], sealing: Option<&DataKey>) -> Result<Self, FormatError> {
        Self::peek_len(b)?;
        let sealed = u32_at(b, 0) == SEALED_MAGIC;
        if sealed != sealing.is_some() {
            return Err(FormatError::Sealing);
        }
        let header_len = u32_at(b, 24) as usize;
        let version = u16_at(b, 4) as u32;
        if version != FORMAT_VERSION {
            return Err(FormatError::Version { found: version });
        }
        if b.len() < header_len {
            return Err(FormatError::Malformed("short header"));
        }
        let key_len = u16_at(b, 6) as usize;
        let value_len = u64_at(b, 16);
        if key_len > MAX_KEY_LEN || value_len > MAX_REGION_SIZE {
            return Err(FormatError::Malformed("lengths"));
        }
        let layout = EntryLayout::new(key_len, value_len as usize, sealed);
        if layout.header_len != header_len {
            return Err(FormatError::Malformed("header length"));
        }
        let checks_at = layout.checks_at(key_len);
        let end = checks_at + layout.check_len() * layout.chunks();
        if crc32c::crc32c(&b[..end]) != u32_at(b, end) {
            return Err(FormatError::Checksum);
        }
        let key_at = layout.key_at();
        let key = match sealing {
            None => Key::InHeader {
                at: key_at,
                len: key_len,
            },
            Some(device) => {
                let cipher = device.entry(&b[ENTRY_FIXED..key_at]);
                let mut key = b[key_at..key_at + key_len].to_vec().into_boxed_slice();
                let tag = &b[checks_at - TAG_LEN..checks_at];
                if !cipher.open_key(value_len, &mut key, tag) {
                    return Err(FormatError::Checksum);
                }
                Key::Opened {
                    key,
                    cipher: std::sync::Arc::new(cipher),
                }
            }
        };
        Ok(Self {
            epoch: u64_at(b, 8),
            layout,
            key,
            checks_at,
        })
    }

    /// The entry's cache key; `header` is the buffer the header was decoded from.
    pub(crate) fn key<'a>(&'a self, header: &'a [u8]) -> &'a [u8] {
        match &self.key {
            Key::InHeader { at, len } => &header[*at..*at + *len],
            Key::Opened { key, .. } => key,
        }
    }

    /// Check chunks `first..` of the value, and decrypt them in place if sealed; `data` starts
    /// at chunk `first`'s first byte and covers whole chunks (the last one may be the value's
    /// short tail). False if any chunk fails: `data` must then not be used.
    pub(crate) fn verify(&self, header: &[u8], first: usize, data: &mut [u8]) -> bool {
        let check_len = self.layout.check_len();
        let checks_end = self.checks_at + check_len * self.layout.chunks();
        let value_len = self.layout.value_len as u64;
        data.chunks_mut(CHUNK).enumerate().all(|(i, chunk)| {
            let at = self.checks_at + check_len * (first + i);
            if at + check_len > checks_end {
                return false;
            }
            let check = &header[at..at + check_len];
            match &self.key {
                Key::InHeader { .. } => crc32c::crc32c(chunk) == u32_at(check, 0),
                Key::Opened { cipher, .. } => {
                    cipher.open_chunk((first + i) as u32, value_len, chunk, check)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let sb = Superblock {
            region_size: 64 << 20,
            generation: 7,
            partitions: vec![
                PartitionExtent {
                    name: "default".into(),
                    first_region: 0,
                    regions: 10,
                },
                PartitionExtent {
                    name: "logs".into(),
                    first_region: 10,
                    regions: 3,
                },
            ],
            sealing: [9u8; CHECK_LEN],
            wrapped: [3u8; WRAPPED_LEN],
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b), Ok(sb));
        b[100] ^= 1;
        assert_eq!(Superblock::decode(&b), Err(FormatError::Checksum));
        b[8] = 9;
        assert_eq!(
            Superblock::decode(&b),
            Err(FormatError::Version { found: 9 })
        );
        assert_eq!(
            Superblock::decode(&vec![0u8; PAGE]),
            Err(FormatError::Magic)
        );
    }

    #[test]
    fn region_header_and_summary_round_trip() {
        let recs: Vec<_> = (0..300)
            .map(|i| SummaryRecord {
                hash: i * 31,
                page: i as u32,
                pages: 2,
            })
            .collect();
        let (bytes, crc) = encode_summary(&recs);
        assert_eq!(bytes.len() as u64, summary_len(recs.len()));
        assert_eq!(decode_summary(&bytes, 300, crc), Ok(recs));
        let h = RegionHeader {
            generation: 1,
            epoch: 99,
            summary_offset: 8192,
            summary_entries: 300,
            summary_crc: crc,
        };
        assert_eq!(RegionHeader::decode(&h.encode()), Ok(h));
        let mut damaged = bytes.clone();
        damaged[5] ^= 0x10;
        assert_eq!(
            decode_summary(&damaged, 300, crc),
            Err(FormatError::Checksum)
        );
    }

    #[test]
    fn an_entry_encoded_into_a_used_buffer_leaves_none_of_its_old_bytes() {
        let key = b"bucket/key/etag/3";
        let value = vec![7u8; 3 * CHUNK + 123];
        let layout = EntryLayout::new(key.len(), value.len(), false);
        let mut reused = vec![0xEEu8; layout.total_len()];
        encode_entry(&mut reused, 42, key, &value, None);
        let mut fresh = vec![0u8; layout.total_len()];
        encode_entry(&mut fresh, 42, key, &value, None);
        assert_eq!(
            reused, fresh,
            "padding written with zeros, not left as found"
        );
    }

    #[test]
    fn entry_round_trips_and_verifies_per_chunk() {
        let key = b"bucket/key/etag/3";
        let value: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let layout = EntryLayout::new(key.len(), value.len(), false);
        let mut buf = vec![0u8; layout.total_len()];
        encode_entry(&mut buf, 42, key, &value, None);
        let header = EntryHeader::decode(&buf, None).expect("valid header");
        assert_eq!(header.epoch, 42);
        assert_eq!(header.key(&buf), key);
        let data = buf[layout.header_len..layout.header_len + value.len()].to_vec();
        assert!(header.verify(&buf, 0, &mut data.clone()));
        assert!(header.verify(&buf, 2, &mut data[2 * CHUNK..].to_vec()));
        let mut bad = data.to_vec();
        bad[CHUNK + 5] ^= 1;
        assert!(!header.verify(&buf, 0, &mut bad.clone()));
        // The damaged chunk is not read by a range read of chunk 2 onwards.
        assert!(header.verify(&buf, 2, &mut bad[2 * CHUNK..]));
        let key_check = DataKey::new(&[1u8; 32]);
        assert_eq!(
            EntryHeader::decode(&buf, Some(&key_check)).err(),
            Some(FormatError::Sealing),
            "a cache that seals never reads a plain entry"
        );
        buf[40] ^= 1;
        assert_eq!(
            EntryHeader::decode(&buf, None).err(),
            Some(FormatError::Checksum)
        );
    }

    #[test]
    fn a_sealed_entry_holds_neither_its_value_nor_its_key_and_opens_only_with_its_key() {
        let device = DataKey::new(&[5u8; 32]);
        let key = b"bucket/secret-report.csv/etag/0";
        let value: Vec<u8> = (0..150_000u32).map(|i| (i % 253) as u8).collect();
        let layout = EntryLayout::new(key.len(), value.len(), true);
        let mut buf = vec![0xEEu8; layout.total_len()];
        encode_entry(&mut buf, 7, key, &value, Some(&device));
        let on_disk = buf.clone();
        assert!(
            !on_disk.windows(key.len()).any(|w| w == key),
            "key in clear"
        );
        assert!(
            !on_disk.windows(64).any(|w| w == &value[1000..1064]),
            "value in clear"
        );
        let padding = &on_disk[layout.header_len + value.len()..];
        assert!(padding.iter().all(|&b| b == 0), "padding zeroed");

        let header = EntryHeader::decode(&buf, Some(&device)).expect("valid header");
        assert_eq!((header.epoch, header.key(&buf)), (7, &key[..]));
        let sealed = buf[layout.header_len..layout.header_len + value.len()].to_vec();
        let mut whole = sealed.clone();
        assert!(header.verify(&buf, 0, &mut whole));
        assert_eq!(whole, value);
        // A range read opens the chunks it reads, each alone.
        let mut tail = sealed[2 * CHUNK..].to_vec();
        assert!(header.verify(&buf, 2, &mut tail));
        assert_eq!(tail, &value[2 * CHUNK..]);
        // Chunks are bound to their place: chunk 2's bytes do not open as chunk 1.
        let mut moved = sealed[2 * CHUNK..].to_vec();
        assert!(!header.verify(&buf, 1, &mut moved));
        let mut flipped = sealed.clone();
        flipped[CHUNK + 9] ^= 1;
        assert!(!header.verify(&buf, 0, &mut flipped));

        assert_eq!(
            EntryHeader::decode(&buf, None).err(),
            Some(FormatError::Sealing),
            "a cache without the key never reads ciphertext"
        );
        assert_eq!(
            EntryHeader::decode(&buf, Some(&DataKey::new(&[6u8; 32]))).err(),
            Some(FormatError::Checksum),
            "another key does not open the entry"
        );
        // A changed value length is caught by the header's CRC, and, with the CRC redone (what
        // an attacker would do), by the key's tag: the length is authenticated.
        let mut longer = buf.clone();
        longer[16..24].copy_from_slice(&(value.len() as u64 - 1).to_le_bytes());
        assert!(EntryHeader::decode(&longer, Some(&device)).is_err());
        let end = layout.header_len - 4;
        let crc = crc32c::crc32c(&longer[..end]);
        longer[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(EntryHeader::decode(&longer, Some(&device)).is_err());
    }

    #[test]
    fn a_65_mib_region_holds_64_mib_of_any_power_of_two_block_from_1_to_64_mib() {
        // The proxy's default region size (docs/configuration.md); keys of a few hundred bytes.
        // Sealed or not.
        let region = 65u64 << 20;
        for (block, sealed) in (0..14).map(|s| ((1u64 << 20) << (s % 7), s >= 7)) {
            let entry = EntryLayout::new(300, block as usize, sealed).total_len() as u64;
            let n = (1..)
                .take_while(|&n| PAGE as u64 + n * entry + summary_len(n as usize) <= region)
                .last()
                .expect("one fits");
            assert_eq!(
                n * block,
                64 << 20,
                "{block}-byte blocks, {sealed}: {n} fit"
            );
        }
    }

    #[test]
    fn a_small_value_costs_its_size_rounded_to_a_page() {
        // The header (32 bytes, the key, 4 per 64 KiB chunk, its CRC) shares the value's pages.
        assert_eq!(EntryLayout::new(40, 1000, false).total_len(), PAGE);
        assert_eq!(EntryLayout::new(40, PAGE - 80, false).total_len(), PAGE);
        assert_eq!(EntryLayout::new(40, PAGE, false).total_len(), 2 * PAGE);
        assert_eq!(EntryLayout::new(40, 1000, true).total_len(), PAGE);
        assert_eq!(
            EntryLayout::new(60, 8 << 20, false).total_len(),
            (8 << 20) + PAGE,
            "a block of whole pages pays one page for its header"
        );
        let (key, value) = (b"k", vec![7u8; 1000]);
        let layout = EntryLayout::new(key.len(), value.len(), false);
        let mut buf = vec![0u8; layout.total_len()];
        encode_entry(&mut buf, 1, key, &value, None);
        let header = EntryHeader::decode(&buf, None).expect("valid header");
        assert_eq!(EntryHeader::peek_len(&buf), Ok(PAGE));
        let mut data = buf[layout.header_len..][..1000].to_vec();
        assert!(header.verify(&buf, 0, &mut data));
    }
}
