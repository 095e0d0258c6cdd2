//! TLS on the S3 listener: rustls, with the certificate and key re-read when their files change,
//! so a renewed certificate (cert-manager, ACME) takes effect without a restart.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use crate::reload::WatchedFile;

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
    current: Arc<ArcSwap<ServerConfig>>,
    files: Arc<[WatchedFile; 2]>,
}

impl TlsConfig {
    /// Load `cert` (PEM chain) and `key` (PEM, PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read = |path: &Path| std::fs::read(path).map_err(|e| file_error(path, e));
        let (cert_pem, key_pem) = (read(cert)?, read(key)?);
        let config = server_config([cert, key], &cert_pem, &key_pem)?;
        Ok(Self {
            current: Arc::new(ArcSwap::from_pointee(config)),
            files: Arc::new([
                WatchedFile::new(cert.to_owned(), Some(cert_pem)),
                WatchedFile::new(key.to_owned(), Some(key_pem)),
            ]),
        })
    }

    /// The configuration for the next handshake.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.load_full()
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

    /// Read both files again and, if either changed and the pair loads, use it from the next
    /// handshake. `None`: unchanged. A pair that does not load is tried again when either file
    /// changes next: a renewal writes the certificate and key one after the other, and the
    /// first check may see one of them new.
    pub fn check(&self) -> Option<Result<(), TlsError>> {
        let [cert, key] = &*self.files;
        let ((cert_changed, cert_pem), (key_changed, key_pem)) = (cert.read(), key.read());
        if !cert_changed && !key_changed {
            return None;
        }
        let loaded = cert_pem
            .map_err(|e| file_error(cert.path(), e))
            .and_then(|c| Ok((c, key_pem.map_err(|e| file_error(key.path(), e))?)))
            .and_then(|(c, k)| server_config([cert.path(), key.path()], &c, &k));
        Some(loaded.map(|config| self.current.store(Arc::new(config))))
    }

    /// Check the files every [`crate::reload::RELOAD_CHECK`] until `stop`.
    pub async fn watch(self, stop: CancellationToken) {
        let cert = self.files[0].path().to_owned();
        let report = move |found| match found {
            Some(Ok(())) => tracing::info!(cert = %cert.display(), "TLS certificate reloaded"),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "TLS certificate not reloaded; keeping the previous one");
            }
            None => {}
        };
        crate::reload::poll(stop, move || self.check(), report).await;
    }
}

fn file_error(path: &Path, problem: impl ToString) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        problem: problem.to_string(),
    }
}

/// The configuration serving the chain `cert_pem` with `key_pem`, read from `paths` (certificate,
/// key) to name them in errors.
fn server_config(
    [cert, key]: [&Path; 2],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<ServerConfig, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(cert, e))?;
    if chain.is_empty() {
        return Err(file_error(cert, "no certificate in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| file_error(key, e))?;
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

    #[test]
    fn a_changed_pair_is_used_and_one_that_does_not_load_keeps_the_pair_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, CERT).unwrap();
        std::fs::write(&key, KEY).unwrap();
        let tls = TlsConfig::load(&cert, &key).unwrap();
        let first = tls.current();
        assert!(tls.check().is_none(), "unchanged files reloaded");
        // A renewal half written: the certificate garbled, then the key missing.
        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\ngarbage").unwrap();
        let err = tls.check().unwrap().unwrap_err().to_string();
        assert!(err.contains("cert.pem"), "{err}");
        assert!(
            tls.check().is_none(),
            "a refused pair was tried again unchanged"
        );
        std::fs::write(&cert, CERT).unwrap();
        std::fs::remove_file(&key).unwrap();
        let err = tls.check().unwrap().unwrap_err().to_string();
        assert!(err.contains("key.pem"), "{err}");
        assert!(
            Arc::ptr_eq(&tls.current(), &first),
            "a pair that failed replaced the one in force"
        );
        std::fs::write(&key, KEY).unwrap();
        assert!(tls.check().unwrap().is_ok());
        assert!(
            !Arc::ptr_eq(&tls.current(), &first),
            "the pair was not swapped"
        );
    }

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
