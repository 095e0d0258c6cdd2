//! Files of CA certificates an option names (`upstream_ca_file`, `fleet_tls_ca`), read the same
//! way for each: every `CERTIFICATE` block, at least one, each usable as a trust anchor.

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The certificates of `pem` and a store trusting them, or why they cannot be trusted. Other
/// blocks (a key kept in the same file) are skipped.
pub fn anchors(pem: &[u8]) -> Result<(Vec<CertificateDer<'static>>, RootCertStore), String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM file of certificates ({e})"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    let mut store = RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store
            .add(cert.clone())
            .map_err(|e| format!("certificate {} cannot be trusted: {e}", i + 1))?;
    }
    Ok((certs, store))
}
