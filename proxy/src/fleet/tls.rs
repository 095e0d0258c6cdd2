//! TLS between replicas (`fleet_tls_cert`, `fleet_tls_key`, `fleet_tls_ca`, `fleet_tls_name`):
//! the asking side of it. The answering side is the peer listener's, which serves the
//! replica's certificate as the S3 listener serves its own (`front::tls`, re-read when renewed).
//!
//! Peer requests are signed and answers sealed with the fleet secret ([`super::auth`],
//! [`super::seal`]), so without TLS no one can forge either; TLS adds what the secret cannot:
//! the blocks' bytes, keys and metadata are not readable on the network between replicas.
//!
//! A replica checks a peer's certificate against `fleet_tls_ca` alone, never the system's
//! roots: a certificate any public authority would sign for the name must not make a box a
//! peer. Replicas find each other by address (a Kubernetes headless Service's DNS gives pod
//! IPs), so one name, `fleet_tls_name`, can stand for all of them in their certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::ServerName;
use tokio_util::sync::CancellationToken;

use crate::reload::WatchedFile;

/// Why the peers' CA or name could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PeerTlsError {
    /// The CA file could not be read or holds no usable certificate.
    #[error("fleet_tls_ca {path}: {why}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// `fleet_tls_name` is not a DNS name or IP address.
    #[error("fleet_tls_name {0:?} is not a DNS name or IP address")]
    Name(String),
    /// rustls refused the configuration.
    #[error("fleet TLS: {0}")]
    Config(#[from] rustls::Error),
}

/// How this replica speaks TLS to its peers.
#[derive(Clone)]
pub struct PeerTls {
    /// Trusts `fleet_tls_ca` alone, as the file is now ([`PeerCa`]); offers HTTP/2 only (the
    /// connector sets ALPN).
    pub config: ClientConfig,
    /// The name every peer's certificate must carry, whatever address it was reached at;
    /// `None` checks the host the peer was addressed by.
    pub name: Option<ServerName<'static>>,
    /// The CA the configuration checks peers against, to be watched for changes.
    pub ca: Arc<PeerCa>,
}

impl PeerTls {
    /// Trust the CA certificates of `ca` (PEM; other blocks skipped, at least one certificate)
    /// and check peers' certificates for `name`, or for the host they are addressed by.
    pub fn load(ca: &Path, name: Option<&str>) -> Result<Self, PeerTlsError> {
        let name = name
            .map(|n| ServerName::try_from(n.to_owned()).map_err(|_| PeerTlsError::Name(n.into())))
            .transpose()?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let ca = Arc::new(PeerCa::load(ca, provider.clone())?);
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(ca.clone())
            .with_no_client_auth();
        Ok(Self { config, name, ca })
    }
}

/// Peers' certificates checked against `fleet_tls_ca` as the file is now: read again when it
/// changes, so a CA rotated (cert-manager renewing a CA issuer, or a bundle of the old and new
/// CA for the overlap) is trusted without a restart. A file that does not load is logged and
/// the CA in force kept; connections already open are not checked again.
#[derive(Debug)]
pub struct PeerCa {
    file: WatchedFile,
    provider: Arc<CryptoProvider>,
    verifier: ArcSwap<WebPkiServerVerifier>,
}

impl PeerCa {
    fn load(path: &Path, provider: Arc<CryptoProvider>) -> Result<Self, PeerTlsError> {
        let pem = std::fs::read(path).map_err(|e| ca_error(path, e.to_string()))?;
        let verifier = verifier(path, &pem, &provider)?;
        Ok(Self {
            file: WatchedFile::new(path.to_owned(), Some(pem)),
            provider,
            verifier: ArcSwap::new(verifier),
        })
    }

    /// Read the file again and, if it changed and loads, check peers against it from the next
    /// handshake. `None`: unchanged.
    pub fn check(&self) -> Option<Result<(), PeerTlsError>> {
        let (changed, read) = self.file.read();
        if !changed {
            return None;
        }
        let path = self.file.path();
        let loaded = read
            .map_err(|e| ca_error(path, e.to_string()))
            .and_then(|pem| verifier(path, &pem, &self.provider));
        Some(loaded.map(|v| self.verifier.store(v)))
    }

    /// Check the file every [`crate::reload::RELOAD_CHECK`] until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let path = self.file.path().to_owned();
        let report = |found| match found {
            Some(Ok(())) => tracing::info!(file = %path.display(), "fleet CA reloaded"),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "fleet CA not reloaded; keeping the one in force");
            }
            None => {}
        };
        crate::reload::poll(stop, move || self.check(), report).await;
    }
}

fn ca_error(path: &Path, why: String) -> PeerTlsError {
    PeerTlsError::Ca {
        path: path.to_owned(),
        why,
    }
}

/// A verifier trusting the CA certificates of `pem` alone.
fn verifier(
    path: &Path,
    pem: &[u8],
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, PeerTlsError> {
    let (_, roots) = crate::trust::anchors(pem).map_err(|why| ca_error(path, why))?;
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| ca_error(path, e.to_string()))
}

/// Each check is the verifier in force's: rustls's own WebPKI checks, of the CA as last loaded.
impl ServerCertVerifier for PeerCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier.load().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier
            .load()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier
            .load()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.verifier.load().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `localhost`, the TLS listener's test fixture.
    const CERT: &str = include_str!("../../testdata/localhost.crt");

    #[test]
    fn a_ca_file_must_hold_a_usable_certificate_and_the_name_must_be_one() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let good = write("ca.pem", CERT);
        let tls = PeerTls::load(&good, Some("larder-fleet")).unwrap();
        assert_eq!(
            tls.name,
            Some(ServerName::try_from("larder-fleet").unwrap())
        );
        assert!(PeerTls::load(&good, None).unwrap().name.is_none());
        let err = PeerTls::load(&good, Some("not a name")).err().unwrap();
        assert!(err.to_string().contains("fleet_tls_name"), "{err}");
        let empty = write("empty.pem", "# nothing\n");
        let err = PeerTls::load(&empty, None).err().unwrap().to_string();
        assert!(
            err.contains("no PEM certificate") && err.contains("empty.pem"),
            "{err}"
        );
        let broken = write(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        );
        let err = PeerTls::load(&broken, None).err().unwrap().to_string();
        assert!(err.contains("cannot be trusted"), "{err}");
        let err = PeerTls::load(Path::new("/nonexistent/ca.pem"), None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_changed_ca_file_is_taken_and_one_that_does_not_load_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, CERT).unwrap();
        let tls = PeerTls::load(&path, None).unwrap();
        let in_force = || tls.ca.verifier.load_full();
        let first = in_force();
        assert!(tls.ca.check().is_none());
        // A bundle (the same certificate twice, as the old and new CA would be): taken.
        std::fs::write(&path, format!("{CERT}{CERT}")).unwrap();
        assert!(matches!(tls.ca.check(), Some(Ok(()))));
        let second = in_force();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(tls.ca.check().is_none());
        // Broken, missing: refused once each, the verifier in force kept.
        std::fs::write(&path, "# nothing\n").unwrap();
        let err = tls.ca.check().unwrap().unwrap_err().to_string();
        assert!(err.contains("no PEM certificate"), "{err}");
        assert!(tls.ca.check().is_none());
        std::fs::remove_file(&path).unwrap();
        assert!(tls.ca.check().unwrap().is_err());
        assert!(Arc::ptr_eq(&in_force(), &second));
    }
}
