//! Encryption at rest: what a cache device holds is readable only with the key it was written
//! with, and bytes changed on the device (by a fault or by anyone who can write to it) fail
//! their authentication instead of being served.
//!
//! Two levels of key, as LUKS has. The configured key (a [`DeviceKey`]) never seals an entry: it
//! wraps the device's *data key*, 32 random bytes drawn when the device is formatted and kept
//! in its superblock only wrapped. So rotating the configured key rewraps those 32 bytes
//! (`Encryption::previous`) instead of emptying the cache.
//!
//! Each entry is sealed with AES-256-GCM under a key of its own, derived from the data key and
//! 16 random bytes kept in the entry's header (`HMAC-SHA256(data key, salt)`). A derived key
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
/// Bytes of a wrapped data key: its salt, the key encrypted, its tag.
pub(crate) const WRAPPED_LEN: usize = SALT_LEN + KEY_LEN + TAG_LEN;
/// The nonce of an entry's sealed cache key; value chunks use their index, far below it.
const KEY_NONCE: u32 = u32::MAX;
/// What a wrapping key is derived under, with the wrap's salt after it: longer than a salt, so
/// no wrapping key is an entry's key.
const WRAP_LABEL: &[u8] = b"larder disk data key wrap, v1";

/// The key a disk tier is configured with. It seals no entry itself: it wraps the device's data
/// key (see the module's documentation). Its bytes never reach the device.
#[derive(Clone)]
pub struct DeviceKey {
    mac: hmac::Key,
    /// The data key of a device whose superblock holds no wrapped key: one sealed by a build
    /// that used the configured key as the data key. Such a device opens unchanged.
    unwrapped: [u8; KEY_LEN],
}

impl std::fmt::Debug for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("DeviceKey")
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

impl DeviceKey {
    /// A key from its 32 bytes.
    pub fn new(bytes: &[u8; KEY_LEN]) -> Self {
        Self {
            mac: hmac::Key::new(hmac::HMAC_SHA256, bytes),
            unwrapped: *bytes,
        }
    }

    /// 16 hexadecimal digits that tell this key from another without revealing it, for logs:
    /// which key a replica started with, whether a rotation reached every one.
    pub fn fingerprint(&self) -> String {
        hex(&hmac::sign(&self.mac, b"larder disk key fingerprint, v1").as_ref()[..8])
    }

    fn wrapping(&self, salt: &[u8]) -> LessSafeKey {
        let mut ctx = hmac::Context::with_key(&self.mac);
        ctx.update(WRAP_LABEL);
        ctx.update(salt);
        let key = UnboundKey::new(&AES_256_GCM, ctx.sign().as_ref()).expect("a 32-byte AES key");
        LessSafeKey::new(key)
    }

    /// `data` wrapped under this key: a fresh salt, the key encrypted, its tag.
    pub(crate) fn wrap(&self, data: &[u8; KEY_LEN]) -> [u8; WRAPPED_LEN] {
        let mut out = [0u8; WRAPPED_LEN];
        let salt = DataKey::salt();
        out[..SALT_LEN].copy_from_slice(&salt);
        let (_, rest) = out.split_at_mut(SALT_LEN);
        let (key, tag) = rest.split_at_mut(KEY_LEN);
        key.copy_from_slice(data);
        let sealed = self
            .wrapping(&salt)
            .seal_in_place_separate_tag(nonce(0), Aad::from(WRAP_LABEL), key)
            .expect("AES-GCM seals 32 bytes");
        tag.copy_from_slice(sealed.as_ref());
        out
    }

    /// The data key `wrapped` holds, if it was wrapped under this key and is unchanged; all
    /// zeros (no wrapped key) is a device sealed under this key itself.
    pub(crate) fn unwrap(&self, wrapped: &[u8; WRAPPED_LEN]) -> Option<[u8; KEY_LEN]> {
        if wrapped == &[0u8; WRAPPED_LEN] {
            return Some(self.unwrapped);
        }
        let (salt, rest) = wrapped.split_at(SALT_LEN);
        let (sealed, tag) = rest.split_at(KEY_LEN);
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(sealed);
        self.wrapping(salt)
            .open_in_place_separate_tag(nonce(0), Aad::from(WRAP_LABEL), tag, &mut key)
            .ok()?;
        Some(key)
    }
}

/// The keys a disk tier is encrypted with.
#[derive(Debug, Clone)]
pub struct Encryption {
    /// The key the device's data key is wrapped under.
    pub key: DeviceKey,
    /// The key it was wrapped under until now, during a rotation: a device whose data key it
    /// unwraps is opened with its contents kept, and its data key wrapped under `key` instead.
    pub previous: Option<DeviceKey>,
}

/// A device's data key opened: seals every entry, and keys the index's hashes. Its bytes are
/// on the device only wrapped; the superblock keeps a check value derived from it, so another
/// device's superblock is told from this one's.
pub(crate) struct DataKey {
    mac: hmac::Key,
    /// Keys the hashes the index and the region summaries hold, so a summary read off the
    /// device cannot confirm a guessed cache key.
    index: hmac::Key,
    check: [u8; CHECK_LEN],
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key; the check value is what the superblock shows anyway.
        f.debug_struct("DataKey")
            .field("check", &hex(&self.check))
            .finish()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl DataKey {
    /// A key from its 32 bytes.
    pub(crate) fn new(bytes: &[u8; KEY_LEN]) -> Self {
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
        random()
    }

    /// A fresh data key, for a device being formatted.
    pub(crate) fn generate() -> [u8; KEY_LEN] {
        random()
    }

    /// The cipher of the entry whose salt is `salt`.
    pub(crate) fn entry(&self, salt: &[u8]) -> EntryCipher {
        let derived = hmac::sign(&self.mac, salt);
        let key = UnboundKey::new(&AES_256_GCM, derived.as_ref()).expect("a 32-byte AES key");
        EntryCipher(LessSafeKey::new(key))
    }
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    aws_lc_rs::rand::fill(&mut bytes).expect("the system random generator works");
    bytes
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
        let key = DataKey::new(&[7u8; KEY_LEN]);
        let salt = DataKey::salt();
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
        let other_salt = key.entry(&DataKey::salt());
        assert_eq!(opens(&other_salt, 3, 1000, &tag, &data), None);
        let other_key = DataKey::new(&[8u8; KEY_LEN]).entry(&salt);
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
        let a = DataKey::new(&[1u8; KEY_LEN]);
        assert_eq!(a.check(), DataKey::new(&[1u8; KEY_LEN]).check());
        assert_ne!(a.check(), DataKey::new(&[2u8; KEY_LEN]).check());
        assert_ne!(a.check(), [0u8; CHECK_LEN], "zero means not sealed");
        assert!(!format!("{a:?}").contains(&hex(&[1u8; KEY_LEN])));
        // Index hashes are keyed: the same cache key hashes apart under two device keys.
        let b = DataKey::new(&[2u8; KEY_LEN]);
        assert_eq!(
            a.hash_key(b"k"),
            DataKey::new(&[1u8; KEY_LEN]).hash_key(b"k")
        );
        assert_ne!(a.hash_key(b"k"), b.hash_key(b"k"));
        assert_ne!(a.hash_key(b"k"), a.hash_key(b"l"));
    }

    #[test]
    fn a_wrapped_data_key_opens_only_with_its_key_and_unchanged() {
        let (a, b) = (
            DeviceKey::new(&[1u8; KEY_LEN]),
            DeviceKey::new(&[2u8; KEY_LEN]),
        );
        let data = DataKey::generate();
        let wrapped = a.wrap(&data);
        assert!(!wrapped.windows(KEY_LEN).any(|w| w == data), "not in clear");
        assert_ne!(a.wrap(&data), wrapped, "a fresh salt every time");
        assert_eq!(a.unwrap(&wrapped), Some(data));
        assert_eq!(b.unwrap(&wrapped), None, "another key");
        for at in [0, SALT_LEN + 3, WRAPPED_LEN - 1] {
            let mut changed = wrapped;
            changed[at] ^= 1;
            assert_eq!(a.unwrap(&changed), None, "byte {at} changed");
        }
        // No wrapped key: the configured key is the data key (a device sealed before wrapping).
        assert_eq!(a.unwrap(&[0u8; WRAPPED_LEN]), Some([1u8; KEY_LEN]));
        // Fingerprints tell keys apart and show neither.
        assert_eq!(
            a.fingerprint(),
            DeviceKey::new(&[1u8; KEY_LEN]).fingerprint()
        );
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 16);
        assert!(!format!("{a:?}").contains(&hex(&[1u8; KEY_LEN])));
        assert!(format!("{a:?}").contains(&a.fingerprint()));
    }
}
