//! SigV4 signing keys, derived once per secret, day and region instead of once per request.
//!
//! A SigV4 signing key is four chained HMACs of the secret, the date, the region and the
//! service (`s3`). It is the same for every request a key signs in one region on one day, so
//! each [`Key`](super::keys::Key) keeps the few it derived last. The cache belongs to the key
//! entry itself, beside the secret it is derived from (which is private to the entry), so a
//! kept signing key is only ever used for the access key and secret it came from; sharing one
//! cache between access keys would let one key's holder sign as another (the e2e attack test
//! `test_a_signing_key_kept_for_one_access_key_never_verifies_another`).

use std::sync::{Mutex, PoisonError};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// A derived SigV4 signing key (kSigning).
pub(crate) type SigningKey = [u8; 32];

/// How many (date, region) pairs one secret keeps. Two dates cover a client signing across
/// midnight (a request may be up to 15 minutes off Larder's clock); the rest cover a key used
/// in more than one region. Beyond that the oldest is replaced, so a client cycling through
/// regions costs itself derivations, and the memory stays bounded.
const SLOTS: usize = 4;

/// The signing keys derived from one secret.
#[derive(Default)]
pub(crate) struct SigningKeys {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    entries: [Option<Entry>; SLOTS],
    /// The slot the next new key replaces (the oldest).
    next: usize,
}

struct Entry {
    date: [u8; 8],
    region: Box<str>,
    key: SigningKey,
}

impl SigningKeys {
    /// The signing key of `secret` for `date` (`YYYYMMDD`) and `region`, derived on first use.
    /// `secret` must always be the same for one `SigningKeys`; [`Key`](super::keys::Key)
    /// guarantees that by owning both.
    pub(crate) fn get(&self, secret: &str, date: &str, region: &str) -> SigningKey {
        let Ok(date_bytes) = <[u8; 8]>::try_from(date.as_bytes()) else {
            // Not a date a credential scope allows; derive it without keeping it.
            return derive(secret, date, region);
        };
        let found = self
            .lock()
            .entries
            .iter()
            .flatten()
            .find(|e| e.date == date_bytes && &*e.region == region)
            .map(|e| e.key);
        if let Some(key) = found {
            return key;
        }
        // Derived outside the lock: other requests of the key do not wait for it.
        let key = derive(secret, date, region);
        let mut slots = self.lock();
        let slot = slots.next;
        slots.entries[slot] = Some(Entry {
            date: date_bytes,
            region: region.into(),
            key,
        });
        slots.next = (slot + 1) % SLOTS;
        key
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // Nothing a panicking holder could leave half-written here is unsafe to read: every
        // entry is written whole.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.lock().entries.iter().flatten().count()
    }
}

/// kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), "s3"), "aws4_request").
fn derive(secret: &str, date: &str, region: &str) -> SigningKey {
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    for part in [region, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    key
}

/// HMAC-SHA256 of `data` under `key`.
pub(crate) fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    /// The AWS SDK's derivation, for the two days these tests use.
    fn sdk(secret: &str, date: &str, region: &str) -> Vec<u8> {
        let day = match date {
            "20130524" => 15_849,
            "20130525" => 15_850,
            _ => unreachable!("{date}"),
        };
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(day * 86_400);
        aws_sigv4::sign::v4::generate_signing_key(secret, time, region, "s3")
            .as_ref()
            .to_vec()
    }

    #[test]
    fn a_key_is_the_sdks_derivation_and_is_kept_per_date_and_region() {
        let keys = SigningKeys::default();
        let first = keys.get(SECRET, "20130524", "us-east-1");
        assert_eq!(first.to_vec(), sdk(SECRET, "20130524", "us-east-1"));
        assert_eq!(keys.get(SECRET, "20130524", "us-east-1"), first);
        assert_eq!(keys.kept(), 1);
        let next_day = keys.get(SECRET, "20130525", "us-east-1");
        assert_eq!(next_day.to_vec(), sdk(SECRET, "20130525", "us-east-1"));
        let other_region = keys.get(SECRET, "20130524", "eu-west-1");
        assert_eq!(other_region.to_vec(), sdk(SECRET, "20130524", "eu-west-1"));
        assert_ne!(first, next_day);
        assert_ne!(first, other_region);
        assert_eq!(keys.kept(), 3);
    }

    #[test]
    fn at_most_a_few_keys_are_kept_and_replaced_keys_still_derive_right() {
        let keys = SigningKeys::default();
        for i in 0..10 {
            let region = format!("region-{i}");
            assert_eq!(
                keys.get(SECRET, "20130524", &region).to_vec(),
                sdk(SECRET, "20130524", &region)
            );
        }
        assert_eq!(keys.kept(), SLOTS);
        assert_eq!(
            keys.get(SECRET, "20130524", "region-0").to_vec(),
            sdk(SECRET, "20130524", "region-0")
        );
        // A date that is not 8 bytes is derived but not kept.
        let odd = keys.get(SECRET, "2013052", "us-east-1");
        assert_eq!(odd, derive(SECRET, "2013052", "us-east-1"));
        assert_eq!(keys.kept(), SLOTS);
    }
}
