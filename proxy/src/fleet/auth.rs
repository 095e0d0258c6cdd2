//! Peer requests are signed with a secret every replica shares: an HMAC-SHA256 of the time, the
//! method and the path with its query, sent in one header. The secret itself never crosses the
//! network, and a captured signature stops working after [`MAX_SKEW`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The header carrying `<unix seconds>:<hex signature>`.
pub const HEADER: &str = "x-larder-peer-auth";

/// How far a signature's time may be from the verifier's clock.
pub const MAX_SKEW: Duration = Duration::from_secs(300);

/// The fleet's shared secret.
#[derive(Clone)]
pub struct PeerSecret(Vec<u8>);

impl std::fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerSecret(..)")
    }
}

/// Why a shared secret was refused.
#[derive(Debug, thiserror::Error)]
#[error("the fleet secret must be at least 16 bytes (after trimming whitespace)")]
pub struct WeakSecret;

impl PeerSecret {
    /// A secret from the contents of a file, surrounding whitespace trimmed.
    pub fn new(bytes: &[u8]) -> Result<Self, WeakSecret> {
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < 16 {
            return Err(WeakSecret);
        }
        Ok(Self(trimmed.to_vec()))
    }

    fn mac(&self, time: u64, method: &str, path_and_query: &str) -> Vec<u8> {
        // A key of any length is accepted by HMAC: this cannot fail.
        let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(format!("larder-peer-v1\n{time}\n{method}\n{path_and_query}").as_bytes());
        mac.finalize().into_bytes().to_vec()
    }

    /// The MAC of piece `seq` of the answer to the request signed by `request` (its
    /// [`HEADER`] value): binds each piece of an answer to the secret, to that very request and
    /// to its place in the answer, so a piece cannot be forged, replayed into another answer or
    /// moved.
    pub fn answer_mac(&self, request: &str, seq: u64, data: &[u8]) -> [u8; 32] {
        let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(b"larder-peer-answer-v1\n");
        mac.update(request.as_bytes());
        mac.update(&seq.to_be_bytes());
        mac.update(&(data.len() as u64).to_be_bytes());
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    /// Whether `mac` is [`PeerSecret::answer_mac`] of these (in constant time).
    pub fn verify_answer(&self, request: &str, seq: u64, data: &[u8], mac: &[u8]) -> bool {
        bool::from(self.answer_mac(request, seq, data).ct_eq(mac))
    }

    /// The header value signing a request sent now.
    pub fn sign(&self, method: &str, path_and_query: &str) -> String {
        let time = unix_now();
        format!(
            "{time}:{}",
            hex::encode(self.mac(time, method, path_and_query))
        )
    }

    /// Whether `header` signs this request and is recent enough.
    pub fn verify(&self, header: &str, method: &str, path_and_query: &str) -> bool {
        let Some((time, signature)) = header.split_once(':') else {
            return false;
        };
        let (Ok(time), Ok(signature)) = (time.parse::<u64>(), hex::decode(signature)) else {
            return false;
        };
        if unix_now().abs_diff(time) > MAX_SKEW.as_secs() {
            return false;
        }
        bool::from(self.mac(time, method, path_and_query).ct_eq(&signature))
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_request_and_secret() {
        let secret = PeerSecret::new(b"  a-secret-of-enough-length\n").unwrap();
        let header = secret.sign("GET", "/v1/block?bucket=b&key=k");
        assert!(secret.verify(&header, "GET", "/v1/block?bucket=b&key=k"));
        assert!(!secret.verify(&header, "GET", "/v1/block?bucket=b&key=other"));
        assert!(!secret.verify(&header, "HEAD", "/v1/block?bucket=b&key=k"));
        let other = PeerSecret::new(b"another-secret-of-enough-length").unwrap();
        assert!(!other.verify(&header, "GET", "/v1/block?bucket=b&key=k"));
        for bad in ["", "x", "12:zz", "12", ":"] {
            assert!(!secret.verify(bad, "GET", "/"));
        }
    }

    #[test]
    fn an_old_signature_is_refused() {
        let secret = PeerSecret::new(b"a-secret-of-enough-length").unwrap();
        let old = unix_now() - MAX_SKEW.as_secs() - 10;
        let header = format!("{old}:{}", hex::encode(secret.mac(old, "GET", "/v1/info")));
        assert!(!secret.verify(&header, "GET", "/v1/info"));
        let recent = unix_now() - 10;
        let header = format!(
            "{recent}:{}",
            hex::encode(secret.mac(recent, "GET", "/v1/info"))
        );
        assert!(secret.verify(&header, "GET", "/v1/info"));
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(PeerSecret::new(b"short\n").is_err());
        assert!(PeerSecret::new(b"                      ").is_err());
    }
}
