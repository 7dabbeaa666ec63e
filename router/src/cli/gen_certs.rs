//! `shoal mesh gen-certs`: a cluster CA and per-node leaf certificates for
//! the mTLS load plane, so a quick start needs no openssl.
//!
//! Each leaf names its node as a DNS SAN (an IP SAN when the name is an IP
//! literal) and allows both server and client authentication, because every
//! replica both dials and accepts load links. Private keys are written with
//! mode 0600.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// Why generating certificates failed.
#[derive(Debug, thiserror::Error)]
pub enum GenCertsError {
    /// A node name that cannot be a certificate name.
    #[error("node name `{0}` is not a valid DNS name or IP address")]
    BadName(String),
    /// The same node twice.
    #[error("node `{0}` is listed twice")]
    Duplicate(String),
    /// A file is in the way and `--force` was not given.
    #[error("{0} already exists (pass --force to overwrite)")]
    Exists(PathBuf),
    /// Writing failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate library refused the parameters.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// The files one run wrote.
#[derive(Debug)]
pub struct GeneratedFiles {
    /// Every path written, CA first.
    pub paths: Vec<PathBuf>,
}

/// A certificate name: an IP literal, a node name, or a wildcard whose `*`
/// is the whole first label (one certificate for pods with random names).
fn valid_node_name(name: &str) -> bool {
    name.parse::<std::net::IpAddr>().is_ok()
        || shoal_mesh::identity::valid_node_name(name.strip_prefix("*.").unwrap_or(name))
}

fn validity(params: &mut CertificateParams, years: u32) {
    let now_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Whole calendar years keep this free of a date library: valid from the
    // start of last year until the start of (this year + years).
    let this_year = 1970 + i32::try_from(now_secs / 31_556_952).unwrap_or(0);
    let years = i32::try_from(years).unwrap_or(10);
    params.not_before = rcgen::date_time_ymd(this_year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(this_year + years, 1, 1);
}

fn write(path: &Path, contents: &str, secret: bool, force: bool) -> Result<(), GenCertsError> {
    if path.exists() && !force {
        return Err(GenCertsError::Exists(path.to_path_buf()));
    }
    let io = |source| GenCertsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)
}

/// Writes `ca.pem`, `ca-key.pem`, and `NODE.pem` + `NODE-key.pem` for each
/// node into `out` (created if missing).
pub fn generate(
    out: &Path,
    nodes: &[String],
    valid_years: u32,
    force: bool,
) -> Result<GeneratedFiles, GenCertsError> {
    for (i, node) in nodes.iter().enumerate() {
        if !valid_node_name(node) {
            return Err(GenCertsError::BadName(node.clone()));
        }
        if nodes[..i].contains(node) {
            return Err(GenCertsError::Duplicate(node.clone()));
        }
    }
    std::fs::create_dir_all(out).map_err(|source| GenCertsError::Io {
        path: out.to_path_buf(),
        source,
    })?;

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Shoal mesh CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca_params, valid_years);
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let mut paths = Vec::with_capacity(2 + 2 * nodes.len());
    let ca_path = out.join("ca.pem");
    write(&ca_path, &ca.pem(), false, force)?;
    paths.push(ca_path);
    let ca_key_path = out.join("ca-key.pem");
    write(&ca_key_path, &ca_key_pem, true, force)?;
    paths.push(ca_key_path);

    for node in nodes {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = vec![match node.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(node.clone().try_into()?),
        }];
        params.distinguished_name.push(DnType::CommonName, node);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        validity(&mut params, valid_years);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let cert_path = out.join(format!("{node}.pem"));
        write(&cert_path, &cert.pem(), false, force)?;
        paths.push(cert_path);
        let key_path = out.join(format!("{node}-key.pem"));
        write(&key_path, &key.serialize_pem(), true, force)?;
        paths.push(key_path);
    }
    Ok(GeneratedFiles { paths })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use shoal_mesh::{PemSource, TlsConfig, tls};

    fn leaf(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).unwrap()
    }

    #[test]
    fn generated_material_loads_and_names_each_node() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = vec![
            "a.shoal".to_string(),
            "b".to_string(),
            "127.0.0.1".to_string(),
        ];
        let files = generate(dir.path(), &nodes, 1, false).unwrap();
        assert_eq!(files.paths.len(), 8);
        for node in &nodes {
            let tls_config = TlsConfig {
                ca: PemSource::Path(dir.path().join("ca.pem")),
                cert: PemSource::Path(dir.path().join(format!("{node}.pem"))),
                key: PemSource::Path(dir.path().join(format!("{node}-key.pem"))),
            };
            tls::load(&tls_config, Some(node)).unwrap();
        }
        let a_as_b = TlsConfig {
            ca: PemSource::Path(dir.path().join("ca.pem")),
            cert: PemSource::Path(dir.path().join("a.shoal.pem")),
            key: PemSource::Path(dir.path().join("a.shoal-key.pem")),
        };
        let err = tls::load(&a_as_b, Some("b")).unwrap_err().to_string();
        assert!(
            err.contains("`b`") && err.contains("a.shoal"),
            "names what it holds: {err}"
        );
        let a = leaf(&dir.path().join("a.shoal.pem"));
        assert!(tls::cert_names_node(&a, "a.shoal"));
        assert!(!tls::cert_names_node(&a, "b"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("b-key.pem"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn refuses_bad_names_duplicates_and_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let err = generate(dir.path(), &["bad name".into()], 1, false).unwrap_err();
        assert!(err.to_string().contains("bad name"));
        let err = generate(dir.path(), &["a".into(), "a".into()], 1, false).unwrap_err();
        assert!(err.to_string().contains("twice"));
        generate(dir.path(), &["a".into()], 1, false).unwrap();
        let err = generate(dir.path(), &["a".into()], 1, false).unwrap_err();
        assert!(err.to_string().contains("--force"));
        generate(dir.path(), &["a".into()], 1, true).unwrap();
    }
}
