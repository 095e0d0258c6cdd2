//! TLS on the S3 listener: rustls, with the certificate and key re-read when their files change,
//! so a renewed certificate (cert-manager, ACME) takes effect without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// How often the files are checked for changes.
pub const RELOAD_CHECK: Duration = Duration::from_secs(5);

/// Why the certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{path}: {problem}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// rustls refused the pair (the key does not match the certificate, ...).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The current TLS configuration, swapped when the files change.
#[derive(Clone)]
pub struct TlsConfig {
    current: Arc<RwLock<Arc<ServerConfig>>>,
    cert: PathBuf,
    key: PathBuf,
}

impl TlsConfig {
    /// Load `cert` (PEM chain) and `key` (PEM, PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let config = server_config(cert, key)?;
        Ok(Self {
            current: Arc::new(RwLock::new(Arc::new(config))),
            cert: cert.to_owned(),
            key: key.to_owned(),
        })
    }

    /// The configuration for the next handshake.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().clone()
    }

    /// Re-read the files whenever their modification times change, until `stop`. A pair that
    /// fails to load is logged and the previous one kept.
    pub async fn watch(self, stop: CancellationToken) {
        let mut seen = (mtime(&self.cert), mtime(&self.key));
        loop {
            tokio::select! {
                () = tokio::time::sleep(RELOAD_CHECK) => {}
                () = stop.cancelled() => return,
            }
            let now = (mtime(&self.cert), mtime(&self.key));
            if now == seen {
                continue;
            }
            match server_config(&self.cert, &self.key) {
                Ok(config) => {
                    *self.current.write() = Arc::new(config);
                    seen = now;
                    tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                }
                Err(e) => {
                    // Often a half-written renewal; the next check will see the finished files.
                    tracing::warn!(error = %e, "TLS certificate not reloaded; keeping the previous one");
                }
            }
        }
    }
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let file_error = |path: &Path, problem: String| TlsError::File {
        path: path.display().to_string(),
        problem,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_error(cert, "no certificate in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_missing_and_garbage_files_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        let missing = dir.path().join("missing.pem");
        let err = TlsConfig::load(&missing, &garbage)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("missing.pem"), "{err}");
        let err = TlsConfig::load(&garbage, &garbage)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("garbage.pem"), "{err}");
    }
}
