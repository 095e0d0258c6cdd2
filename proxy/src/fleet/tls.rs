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

use rustls::ClientConfig;
use rustls_pki_types::ServerName;

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
    /// Trusts `fleet_tls_ca` alone; offers HTTP/2 only (the connector sets ALPN).
    pub config: ClientConfig,
    /// The name every peer's certificate must carry, whatever address it was reached at;
    /// `None` checks the host the peer was addressed by.
    pub name: Option<ServerName<'static>>,
}

impl PeerTls {
    /// Trust the CA certificates of `ca` (PEM; other blocks skipped, at least one certificate)
    /// and check peers' certificates for `name`, or for the host they are addressed by.
    pub fn load(ca: &Path, name: Option<&str>) -> Result<Self, PeerTlsError> {
        let ca_error = |why: String| PeerTlsError::Ca {
            path: ca.to_owned(),
            why,
        };
        let pem = std::fs::read(ca).map_err(|e| ca_error(e.to_string()))?;
        let (_, roots) = crate::trust::anchors(&pem).map_err(ca_error)?;
        let name = name
            .map(|n| ServerName::try_from(n.to_owned()).map_err(|_| PeerTlsError::Name(n.into())))
            .transpose()?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self { config, name })
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
}
