//! Mutual TLS for the load plane: both ends present a certificate from the
//! cluster CA, and each end checks that the other's certificate names the
//! node it claims to be.
//!
//! Only the `ring` provider is used, passed explicitly, so no process-wide
//! default provider is needed and none can conflict.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::config::TlsConfig;

/// ALPN protocol id of the load plane; both ends must offer it.
pub const ALPN: &[u8] = b"shoal-mesh/1";

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("reading {what}: {source}")]
    Read {
        /// Which input (`ca`, `cert`, `key`).
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM input held no usable item or a malformed one.
    #[error("parsing {what}: {reason}")]
    Parse {
        /// Which input.
        what: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the material.
    #[error("tls setup: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client verifier could not be built (e.g. empty CA).
    #[error("client verifier: {0}")]
    Verifier(String),
    /// The certificate does not name this node, so no peer would verify it.
    #[error(
        "the certificate does not name this node `{node}` (it names: {names}); \
         give --mesh-name one of those names, or make a certificate for it (shoal mesh gen-certs)"
    )]
    NotNamed {
        /// The node name (`--mesh-name`).
        node: String,
        /// The DNS names the certificate holds.
        names: String,
    },
}

/// The rustls configs of one node, built once at start.
#[derive(Debug, Clone)]
pub struct TlsConfigs {
    /// Accepting side: requires a client certificate from the cluster CA.
    pub server: Arc<rustls::ServerConfig>,
    /// Dialing side: presents our certificate, trusts only the cluster CA.
    pub client: Arc<rustls::ClientConfig>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(what: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Parse {
            what,
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Parse {
            what,
            reason: "no certificate found".into(),
        });
    }
    Ok(certs)
}

/// The DNS names a certificate holds (its subject alternative names).
fn dns_names(leaf: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some(dns.to_string()),
            _ => None,
        })
        .collect()
}

/// Loads the CA, chain and key and builds both rustls configs (TLS 1.3,
/// ALPN [`ALPN`], client certificates required). The certificate must be
/// valid for `node` when one is given: peers check it against the name
/// this node claims, so a mismatch would leave it unverified by everyone,
/// silently.
pub fn load(tls: &TlsConfig, node: Option<&str>) -> Result<TlsConfigs, TlsError> {
    let read = |what, src: &crate::config::PemSource| {
        src.read().map_err(|source| TlsError::Read { what, source })
    };
    let ca = certs("ca", &read("ca", &tls.ca)?)?;
    let chain = certs("cert", &read("cert", &tls.cert)?)?;
    if let Some(node) = node
        && !cert_names_node(&chain[0], node)
    {
        let names = dns_names(&chain[0]);
        return Err(TlsError::NotNamed {
            node: node.to_string(),
            names: if names.is_empty() {
                "no DNS name".into()
            } else {
                names.join(", ")
            },
        });
    }
    let key_pem = read("key", &tls.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Parse {
        what: "key",
        reason: e.to_string(),
    })?;
    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots.add(cert)?;
    }
    let roots = Arc::new(roots);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())?;
    server.alpn_protocols = vec![ALPN.to_vec()];
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    client.alpn_protocols = vec![ALPN.to_vec()];
    Ok(TlsConfigs {
        server: Arc::new(server),
        client: Arc::new(client),
    })
}

/// True when `leaf` (already verified against the CA by rustls) is valid
/// for the DNS name `node`: the peer is who its frames say it is.
pub fn cert_names_node(leaf: &CertificateDer<'_>, node: &str) -> bool {
    let Ok(name) = ServerName::try_from(node) else {
        return false;
    };
    match webpki::EndEntityCert::try_from(leaf) {
        Ok(cert) => cert.verify_is_valid_for_subject_name(&name).is_ok(),
        Err(_) => false,
    }
}
