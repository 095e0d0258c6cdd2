//! TLS on the S3 listener: rustls, with the certificate and key re-read when their files change,
//! so a renewed certificate (cert-manager, ACME) takes effect without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use crate::reload::RELOAD_CHECK;

/// Most bytes of records one connection holds encrypted and not yet written (rustls's limit,
/// 64 KiB by default). At 64 KiB, a 64 KiB body and its head did not fit: what the head pushed
/// over went out in a second write of its own, and 64 KiB hits cost 41.6 ms of CPU per 1,000
/// requests against 37.3 with this (docs/benchmarks.md, "Hits over TLS"). The buffer fills
/// only while a client takes bytes slower than they come: `max_connections` (4,096) slow
/// clients hold 320 MiB at most.
pub const SEND_BUFFER: usize = 80 * 1024;

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

    /// The handshake of a connection accepted on `io`, with the current configuration and
    /// [`SEND_BUFFER`].
    pub fn accept<IO>(&self, io: IO) -> tokio_rustls::Accept<IO>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        tokio_rustls::TlsAcceptor::from(self.current())
            .accept_with(io, |c| c.set_buffer_limit(Some(SEND_BUFFER)))
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

    /// A self-signed certificate for `localhost` (ECDSA P-256, valid until 2126) and its key,
    /// made with `openssl req -x509` for tests only.
    const CERT: &str = include_str!("../../testdata/localhost.crt");
    const KEY: &str = include_str!("../../testdata/localhost.key");

    /// Counts the writes that reach the connection's socket (here one end of a pipe in memory).
    struct CountedWrites {
        inner: tokio::io::DuplexStream,
        writes: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl tokio::io::AsyncRead for CountedWrites {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for CountedWrites {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }

        /// One write of every slice, as `writev` on a socket with room for them.
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, &all);
            if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
                self.writes
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            polled
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    #[tokio::test]
    async fn a_64_kib_body_and_its_head_leave_in_one_write() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, CERT).unwrap();
        std::fs::write(&key, KEY).unwrap();
        let tls = TlsConfig::load(&cert, &key).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(&cert).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server_io = CountedWrites {
            inner: server_io,
            writes: writes.clone(),
        };
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let (server, client) =
            tokio::join!(tls.accept(server_io), connector.connect(name, client_io));
        let (mut server, mut client) = (server.unwrap(), client.unwrap());
        // A response's head and a 64 KiB body, as hyper hands them over in one write.
        let mut response = vec![b'h'; 300];
        response.extend((0..64 << 10).map(|i| i as u8));
        writes.store(0, std::sync::atomic::Ordering::SeqCst);
        server.write_all(&response).await.unwrap();
        server.flush().await.unwrap();
        assert_eq!(
            writes.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the response left in more than one write"
        );
        let mut got = vec![0; response.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == response, "the client read other bytes");
    }
}
