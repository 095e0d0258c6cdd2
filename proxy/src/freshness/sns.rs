//! SNS subscription confirmation: S3 -> SNS -> an HTTPS subscription on `POST /v1/events`.
//!
//! SNS asks a new HTTP(S) subscriber to confirm by GETting a `SubscribeURL` it sends in the
//! body. Fetching a URL named by a request body is a server-side request forgery waiting to
//! happen (a request to the cloud's metadata service, to an internal admin port...), so
//! Larder confirms only:
//! - after the events token was checked (SNS presents it as HTTP Basic credentials written in
//!   the subscription's endpoint URL, `https://sns:TOKEN@larder.example/v1/events`);
//! - a URL on one of `events_sns_origins` (by default SNS's own endpoints, `https` only), with
//!   no user info, path `/` and `Action=ConfirmSubscription`;
//! - with one GET, no redirect followed, no body sent, within [`CONFIRM_TIMEOUT`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Empty;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde::{Deserialize, Serialize};

/// Longest a confirmation may take; SNS itself waits about 15 s for the subscriber's answer.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a subscription was not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum SnsError {
    /// The URL is not one Larder may fetch.
    #[error("SubscribeURL refused: {0}")]
    Refused(String),
    /// SNS did not accept the confirmation.
    #[error("confirming the subscription failed: {0}")]
    Failed(String),
}

/// Where a `SubscribeURL` may point: `scheme://host[:port]`, where a `*` label of the host
/// stands for exactly one DNS label (`https://sns.*.amazonaws.com` admits
/// `sns.eu-west-1.amazonaws.com`, not `sns.a.b.amazonaws.com` nor `sns.x.amazonaws.com.evil`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnsOrigin {
    scheme: String,
    labels: Vec<String>,
    port: Option<u16>,
}

impl FromStr for SnsOrigin {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let uri: Uri = s.parse().map_err(|e| format!("{s}: {e}"))?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(format!("{s}: must be scheme://host[:port]"));
        };
        let bare = uri.path_and_query().is_none_or(|p| p.as_str() == "/");
        if !bare || authority.as_str().contains('@') || !matches!(scheme, "http" | "https") {
            return Err(format!("{s}: must be http(s)://host[:port], nothing more"));
        }
        Ok(Self {
            scheme: scheme.to_owned(),
            labels: labels(authority.host()),
            port: uri.port_u16(),
        })
    }
}

impl TryFrom<String> for SnsOrigin {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<SnsOrigin> for String {
    fn from(origin: SnsOrigin) -> String {
        origin.to_string()
    }
}

impl fmt::Display for SnsOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.labels.join("."))?;
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

impl SnsOrigin {
    /// SNS's endpoints in every partition Larder knows: AWS and AWS China.
    pub fn aws() -> Vec<SnsOrigin> {
        [
            "https://sns.*.amazonaws.com",
            "https://sns.*.amazonaws.com.cn",
        ]
        .iter()
        .map(|s| s.parse().expect("a valid origin"))
        .collect()
    }

    fn admits(&self, uri: &Uri) -> bool {
        let Some(host) = uri.host() else { return false };
        let host = labels(host);
        uri.scheme_str() == Some(self.scheme.as_str())
            && uri.port_u16() == self.port
            && host.len() == self.labels.len()
            && self.labels.iter().zip(&host).all(|(want, got)| {
                want == got
                    || (want == "*"
                        && !got.is_empty()
                        && got.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            })
    }
}

fn labels(host: &str) -> Vec<String> {
    host.to_ascii_lowercase()
        .split('.')
        .map(str::to_owned)
        .collect()
}

/// Confirms SNS subscriptions on the allowed origins.
pub struct SnsConfirmer {
    origins: Vec<SnsOrigin>,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl SnsConfirmer {
    /// A confirmer fetching only URLs on `origins`.
    pub fn new(origins: Vec<SnsOrigin>) -> Result<Self, String> {
        Ok(Self {
            origins,
            client: crate::upstream::forward::https_client(
                std::time::Duration::from_secs(5),
                None,
            )?,
        })
    }

    /// The URL to GET if `subscribe_url` may be fetched.
    pub fn check(&self, subscribe_url: &str) -> Result<Uri, SnsError> {
        let refused = |why: &str| SnsError::Refused(format!("{subscribe_url}: {why}"));
        let uri: Uri = subscribe_url.parse().map_err(|_| refused("not a URL"))?;
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(refused("carries user info"));
        }
        if !self.origins.iter().any(|origin| origin.admits(&uri)) {
            return Err(refused("not on events_sns_origins"));
        }
        let confirms = uri.path() == "/"
            && form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                .any(|(k, v)| k == "Action" && v == "ConfirmSubscription");
        if !confirms {
            return Err(refused("not a ConfirmSubscription action"));
        }
        Ok(uri)
    }

    /// Confirm: one GET of the checked URL.
    pub async fn confirm(&self, subscribe_url: &str) -> Result<(), SnsError> {
        let uri = self.check(subscribe_url)?;
        let request = http::Request::get(uri)
            .body(Empty::new())
            .map_err(|e| SnsError::Failed(e.to_string()))?;
        let response = tokio::time::timeout(CONFIRM_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| SnsError::Failed(format!("no answer within {CONFIRM_TIMEOUT:?}")))?
            .map_err(|e| SnsError::Failed(e.to_string()))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(SnsError::Failed(format!(
                "SNS answered {}",
                response.status()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confirmer(origins: &[&str]) -> SnsConfirmer {
        let origins = origins.iter().map(|o| o.parse().unwrap()).collect();
        SnsConfirmer::new(origins).unwrap()
    }

    #[tokio::test]
    async fn only_sns_confirmation_urls_on_allowed_origins_are_fetched() {
        let aws = SnsConfirmer::new(SnsOrigin::aws()).unwrap();
        let ok = "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&Token=t";
        assert!(aws.check(ok).is_ok());
        assert!(aws
            .check("https://sns.cn-north-1.amazonaws.com.cn/?Action=ConfirmSubscription")
            .is_ok());
        for bad in [
            // Another host, or SNS's name inside an attacker's domain.
            "https://169.254.169.254/?Action=ConfirmSubscription",
            "https://sns.eu-west-1.amazonaws.com.evil.example/?Action=ConfirmSubscription",
            "https://sns.a.b.amazonaws.com/?Action=ConfirmSubscription",
            "https://evil.example/sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription",
            // Plain HTTP, another port, user info.
            "http://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription",
            "https://sns.eu-west-1.amazonaws.com:8443/?Action=ConfirmSubscription",
            "https://x@sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription",
            // Another SNS action, another path.
            "https://sns.eu-west-1.amazonaws.com/?Action=Publish&Message=x",
            "https://sns.eu-west-1.amazonaws.com/x?Action=ConfirmSubscription",
            "not a url",
        ] {
            assert!(
                matches!(aws.check(bad), Err(SnsError::Refused(_))),
                "{bad} was admitted"
            );
        }
        let local = confirmer(&["http://127.0.0.1:4566"]);
        assert!(local
            .check("http://127.0.0.1:4566/?Action=ConfirmSubscription")
            .is_ok());
        assert!(local.check(ok).is_err());
    }

    #[test]
    fn origins_parse_strictly_and_print_back() {
        for good in ["https://sns.*.amazonaws.com", "http://127.0.0.1:4566"] {
            assert_eq!(good.parse::<SnsOrigin>().unwrap().to_string(), good);
        }
        for bad in [
            "sns.amazonaws.com",
            "https://sns.*.amazonaws.com/path",
            "https://u@sns.amazonaws.com",
            "ftp://sns.amazonaws.com",
        ] {
            assert!(bad.parse::<SnsOrigin>().is_err(), "{bad}");
        }
    }
}
