//! The certificates Larder trusts when it speaks TLS to the upstream: the system's, and those of
//! `upstream_ca_file` (an S3-compatible store behind a private certificate authority).
//!
//! Both upstream clients take them: the object client ([`super::forward`]: block GETs, HEADs,
//! pass-through) and the AWS SDK's (warm-up's listings). So does the SQS client that polls the
//! upstream's event queue (`events_sqs_queue_url`), which a private store's deployment serves
//! behind the same authority (an SQS-compatible server beside MinIO).
//!
//! The file is read and checked once, at start: the SDK parses the certificates it is given
//! only when it first connects, and panics on one it cannot parse, so a bad file must stop
//! Larder before that, with its path in the error.

use std::path::{Path, PathBuf};

use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;

/// A file of trusted CA certificates that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    /// The file could not be read.
    #[error("reading upstream_ca_file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not PEM certificates, or none at all.
    #[error("upstream_ca_file {path}: {why}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// CA certificates trusted for the upstream's TLS besides the system's, read from one PEM file.
#[derive(Debug, Clone)]
pub struct ExtraRoots {
    /// The file as read: the SDK takes PEM.
    pem: Vec<u8>,
    certs: Vec<CertificateDer<'static>>,
}

impl ExtraRoots {
    /// Read `path`: every `CERTIFICATE` block in it, at least one, each usable as a trust
    /// anchor. Other blocks (a key kept in the same file) are skipped.
    pub fn load(path: &Path) -> Result<Self, RootsError> {
        let pem = std::fs::read(path).map_err(|source| RootsError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_pem(pem).map_err(|why| RootsError::Invalid {
            path: path.to_owned(),
            why,
        })
    }

    fn from_pem(pem: Vec<u8>) -> Result<Self, String> {
        let (certs, _) = crate::trust::anchors(&pem)?;
        Ok(Self { pem, certs })
    }

    /// An HTTPS client for an AWS SDK (S3's for warm-up, SQS's for events) trusting the
    /// system's certificates and these.
    pub fn sdk_http_client(&self) -> Result<SharedHttpClient, String> {
        let trust = tls::TrustStore::default().with_pem_certificate(self.pem.clone());
        let context = tls::TlsContext::builder()
            .with_trust_store(trust)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::AwsLc,
            ))
            .tls_context(context)
            .build_https())
    }

    /// The system's trusted certificates (what `rustls-native-certs` finds, as the AWS SDK
    /// loads them: `SSL_CERT_FILE` and `SSL_CERT_DIR` replace the system's store) and these.
    pub fn with_system_roots(&self) -> RootCertStore {
        let mut store = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "loading the system's CA certificates");
        }
        store.add_parsable_certificates(native.certs);
        for cert in &self.certs {
            // Checked in `from_pem`.
            let _ = store.add(cert.clone());
        }
        store
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `localhost`, the TLS listener's test fixture.
    const CERT: &str = include_str!("../../testdata/localhost.crt");

    #[test]
    fn every_certificate_of_a_bundle_is_trusted_and_other_blocks_are_skipped() {
        let bundle =
            format!("{CERT}-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n{CERT}");
        let roots = ExtraRoots::from_pem(bundle.clone().into_bytes()).unwrap();
        assert_eq!(roots.certs.len(), 2);
        assert_eq!(roots.pem, bundle.as_bytes());
        let mut alone = RootCertStore::empty();
        alone.add(roots.certs[0].clone()).unwrap();
        let trusted = roots.with_system_roots();
        assert!(
            trusted.roots.contains(&alone.roots[0]),
            "the bundle's certificate is trusted"
        );
    }

    #[test]
    fn a_file_without_certificates_or_with_a_broken_one_is_refused() {
        let none = ExtraRoots::from_pem(b"# nothing here\n".to_vec()).unwrap_err();
        assert!(none.contains("no PEM certificate"), "{none}");
        let broken =
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
        let err = ExtraRoots::from_pem(broken.as_bytes().to_vec()).unwrap_err();
        assert!(err.contains("certificate 1 cannot be trusted"), "{err}");
        let missing = ExtraRoots::load(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/ca.pem"),
            "{missing}"
        );
    }
}
