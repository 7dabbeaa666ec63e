//! How `https://` engines are trusted: one rustls client configuration on
//! the ring provider (the only one linked), shared by the proxy's engine client and
//! the side client (health checks, load polls, model lists).
//!
//! Roots: the CA file given (`--worker-tls-ca`), else the system's store;
//! a client certificate when one is given (engines behind mTLS). SNI and
//! name checks use the worker URL's host.

use std::path::Path;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS settings `https://` engines are reached with.
#[derive(Debug, Clone, Default)]
pub struct EngineTlsFiles<'a> {
    /// PEM file of the trusted CAs (else the system's roots).
    pub ca: Option<&'a Path>,
    /// PEM file of a client certificate chain.
    pub cert: Option<&'a Path>,
    /// PEM file of its private key.
    pub key: Option<&'a Path>,
}

/// Builds the client configuration; every error names the file and why.
pub fn client_config(files: &EngineTlsFiles<'_>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match files.ca {
        Some(path) => {
            let certs = read_certs(path, "--worker-tls-ca")?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("--worker-tls-ca {}: {e}", path.display()))?;
            }
        }
        None => {
            // An unreadable system store is not fatal: only `https://`
            // engines need roots, and they then fail with a clear error.
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots);
    let mut config = match (files.cert, files.key) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert, "--worker-tls-cert")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("--worker-tls-key {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("--worker-tls-cert/--worker-tls-key: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{flag} {}: no certificate in it", path.display()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_and_bad_ones_named() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ca = rcgen::generate_simple_self_signed(vec!["engine".into()])
            .unwrap_or_else(|e| panic!("{e}"));
        let ca_path = dir.path().join("ca.pem");
        std::fs::write(&ca_path, ca.cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        let key_path = dir.path().join("key.pem");
        std::fs::write(&key_path, ca.signing_key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
        let files = EngineTlsFiles {
            ca: Some(&ca_path),
            cert: Some(&ca_path),
            key: Some(&key_path),
        };
        let config = client_config(&files).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert!(
            client_config(&EngineTlsFiles::default()).is_ok(),
            "system roots"
        );
        let missing = dir.path().join("missing.pem");
        let err = client_config(&EngineTlsFiles {
            ca: Some(&missing),
            ..EngineTlsFiles::default()
        })
        .unwrap_err();
        assert!(
            err.contains("--worker-tls-ca") && err.contains("missing.pem"),
            "{err}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap_or_else(|e| panic!("{e}"));
        let err = client_config(&EngineTlsFiles {
            ca: Some(&empty),
            ..EngineTlsFiles::default()
        })
        .unwrap_err();
        assert!(err.contains("no certificate"), "{err}");
    }
}
