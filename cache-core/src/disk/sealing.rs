//! Encryption at rest: what a cache device holds is readable only with the key it was written
//! with, and bytes changed on the device (by a fault or by anyone who can write to it) fail
//! their authentication instead of being served.
//!
//! Each entry is sealed with AES-256-GCM under a key of its own, derived from the device key and
//! 16 random bytes kept in the entry's header (`HMAC-SHA256(device key, salt)`). A derived key
//! seals a handful of messages, each with its own nonce: value chunk `i` with nonce `i`, the
//! entry's cache key with nonce `u32::MAX`. So no nonce is ever used twice under one key, however
//! often a device is rewritten or a replica restarted, and no counter has to survive a crash.
//! Every message carries the value's length as associated data: a header whose length was
//! changed on the device does not authenticate.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hmac;

/// Bytes of an encryption key.
pub const KEY_LEN: usize = 32;
/// Bytes of the random salt each sealed entry's key is derived from.
pub(crate) const SALT_LEN: usize = 16;
/// Bytes of an AES-GCM tag.
pub(crate) const TAG_LEN: usize = 16;
/// Bytes of the key check a superblock keeps.
pub(crate) const CHECK_LEN: usize = 16;
/// The nonce of an entry's sealed cache key; value chunks use their index, far below it.
const KEY_NONCE: u32 = u32::MAX;

/// The key a cache device is sealed with. Its bytes never reach the device: the superblock
/// keeps a check value derived from it, so a restart with another key starts the cache empty
/// instead of failing every read.
pub struct DeviceKey {
    mac: hmac::Key,
    /// Keys the hashes the index and the region summaries hold, so a summary read off the
    /// device cannot confirm a guessed cache key.
    index: hmac::Key,
    check: [u8; CHECK_LEN],
}

impl std::fmt::Debug for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key; the check value is what the superblock shows anyway.
        f.debug_struct("DeviceKey")
            .field("check", &hex(&self.check))
            .finish()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl DeviceKey {
    /// A key from its 32 bytes.
    pub fn new(bytes: &[u8; KEY_LEN]) -> Self {
        let mac = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let mut check = [0u8; CHECK_LEN];
        // A label no salt can equal (salts are 16 bytes), so the check is no entry's key.
        check.copy_from_slice(
            &hmac::sign(&mac, b"larder disk cache key check, v1").as_ref()[..CHECK_LEN],
        );
        let index = hmac::Key::new(
            hmac::HMAC_SHA256,
            hmac::sign(&mac, b"larder disk cache index hash, v1").as_ref(),
        );
        Self { mac, index, check }
    }

    /// The 64-bit hash of a cache key in a sealed store: HMAC-SHA256 under a key derived from
    /// this one, where a plain store uses xxh3.
    pub(crate) fn hash_key(&self, key: &[u8]) -> u64 {
        let mac = hmac::sign(&self.index, key);
        let mut first = [0u8; 8];
        first.copy_from_slice(&mac.as_ref()[..8]);
        u64::from_le_bytes(first)
    }

    /// The value a superblock keeps to tell this key from another.
    pub(crate) fn check(&self) -> [u8; CHECK_LEN] {
        self.check
    }

    /// A fresh salt for a new entry, from the operating system's generator.
    pub(crate) fn salt() -> [u8; SALT_LEN] {
        let mut salt = [0u8; SALT_LEN];
        aws_lc_rs::rand::fill(&mut salt).expect("the system random generator works");
        salt
    }

    /// The cipher of the entry whose salt is `salt`.
    pub(crate) fn entry(&self, salt: &[u8]) -> EntryCipher {
        let derived = hmac::sign(&self.mac, salt);
        let key = UnboundKey::new(&AES_256_GCM, derived.as_ref()).expect("a 32-byte AES key");
        EntryCipher(LessSafeKey::new(key))
    }
}

/// One entry's AES-256-GCM key.
pub(crate) struct EntryCipher(LessSafeKey);

impl std::fmt::Debug for EntryCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EntryCipher")
    }
}

fn nonce(index: u32) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[NONCE_LEN - 4..].copy_from_slice(&index.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

impl EntryCipher {
    /// Encrypt value chunk `index` in place; its tag is returned.
    pub(crate) fn seal_chunk(&self, index: u32, value_len: u64, data: &mut [u8]) -> [u8; TAG_LEN] {
        debug_assert!(index != KEY_NONCE);
        self.seal(index, value_len, data)
    }

    /// Decrypt value chunk `index` in place; false if it does not authenticate (its bytes are
    /// then garbage and must not be used).
    pub(crate) fn open_chunk(
        &self,
        index: u32,
        value_len: u64,
        data: &mut [u8],
        tag: &[u8],
    ) -> bool {
        index != KEY_NONCE && self.open(index, value_len, data, tag)
    }

    /// Encrypt the entry's cache key in place.
    pub(crate) fn seal_key(&self, value_len: u64, key: &mut [u8]) -> [u8; TAG_LEN] {
        self.seal(KEY_NONCE, value_len, key)
    }

    /// Decrypt the entry's cache key in place.
    pub(crate) fn open_key(&self, value_len: u64, key: &mut [u8], tag: &[u8]) -> bool {
        self.open(KEY_NONCE, value_len, key, tag)
    }

    fn seal(&self, index: u32, value_len: u64, data: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .0
            .seal_in_place_separate_tag(nonce(index), Aad::from(value_len.to_le_bytes()), data)
            .expect("AES-GCM seals any message shorter than 64 GiB");
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    fn open(&self, index: u32, value_len: u64, data: &mut [u8], tag: &[u8]) -> bool {
        self.0
            .open_in_place_separate_tag(nonce(index), Aad::from(value_len.to_le_bytes()), tag, data)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_chunk_opens_only_with_its_key_its_index_and_its_length() {
        let key = DeviceKey::new(&[7u8; KEY_LEN]);
        let salt = DeviceKey::salt();
        let plain = b"the bytes of one chunk".to_vec();
        let mut data = plain.clone();
        let tag = key.entry(&salt).seal_chunk(3, 1000, &mut data);
        assert_ne!(data, plain, "encrypted");

        let opens = |cipher: &EntryCipher, index, len, tag: &[u8], bytes: &[u8]| {
            let mut d = bytes.to_vec();
            cipher.open_chunk(index, len, &mut d, tag).then_some(d)
        };
        let cipher = key.entry(&salt);
        assert_eq!(opens(&cipher, 3, 1000, &tag, &data), Some(plain.clone()));
        assert_eq!(opens(&cipher, 4, 1000, &tag, &data), None, "another index");
        assert_eq!(opens(&cipher, 3, 999, &tag, &data), None, "another length");
        let other_salt = key.entry(&DeviceKey::salt());
        assert_eq!(opens(&other_salt, 3, 1000, &tag, &data), None);
        let other_key = DeviceKey::new(&[8u8; KEY_LEN]).entry(&salt);
        assert_eq!(opens(&other_key, 3, 1000, &tag, &data), None);
        let mut flipped = data.clone();
        flipped[2] ^= 1;
        assert_eq!(
            opens(&cipher, 3, 1000, &tag, &flipped),
            None,
            "a flipped bit"
        );
        assert_eq!(
            opens(&cipher, KEY_NONCE, 1000, &tag, &data),
            None,
            "a chunk is never opened as the key"
        );
    }

    #[test]
    fn the_check_value_tells_keys_apart_and_debug_never_shows_the_key() {
        let a = DeviceKey::new(&[1u8; KEY_LEN]);
        assert_eq!(a.check(), DeviceKey::new(&[1u8; KEY_LEN]).check());
        assert_ne!(a.check(), DeviceKey::new(&[2u8; KEY_LEN]).check());
        assert_ne!(a.check(), [0u8; CHECK_LEN], "zero means not sealed");
        assert!(!format!("{a:?}").contains(&hex(&[1u8; KEY_LEN])));
        // Index hashes are keyed: the same cache key hashes apart under two device keys.
        let b = DeviceKey::new(&[2u8; KEY_LEN]);
        assert_eq!(
            a.hash_key(b"k"),
            DeviceKey::new(&[1u8; KEY_LEN]).hash_key(b"k")
        );
        assert_ne!(a.hash_key(b"k"), b.hash_key(b"k"));
        assert_ne!(a.hash_key(b"k"), a.hash_key(b"l"));
    }
}
