//! Development certificates: a CA and a serving certificate signed by it (`switchyard certs`,
//! `serve --dev-tls`). Production certificates come from cert-manager or from
//! `certs/make-webhook-cert.sh`.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{name:?} is not a valid DNS name for a certificate: {source}")]
    BadName { name: String, source: rcgen::Error },
    #[error("{0:?} is not a DNS name: letters, digits, '-' and '.', labels of at most 63 characters (a wildcard \"*.\" first at most)")]
    NotADnsName(String),
    // The I/O error is said in the message, with a hint after it: not a `source` as well,
    // or the one-line error would say it twice.
    #[error("cannot write {path}: {error}{}", write_hint(.error))]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// What to check when writing failed, for the failures a user can fix.
fn write_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => "; check the directory is writable",
        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => {
            "; a file is in the way of the directory"
        }
        std::io::ErrorKind::NotFound => "; check the directory exists",
        _ => "",
    }
}

/// PEM texts of a freshly made CA and serving certificate.
pub struct Generated {
    pub ca_cert_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Names the development certificate is made for when none are given.
pub fn default_names() -> (Vec<String>, Vec<IpAddr>) {
    (
        vec!["localhost".into()],
        vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
        ],
    )
}

/// A CA valid for ten years and an ECDSA P-256 serving certificate for `dns` and `ips`, valid
/// for one year and usable for serverAuth and clientAuth (the same pair can play the client in
/// tests of `--client-ca`).
pub fn generate(dns: &[String], ips: &[IpAddr]) -> Result<Generated, CertsError> {
    generate_valid_for(dns, ips, time::Duration::days(365))
}

/// [`generate`] with a serving certificate valid for `validity` from now.
pub(crate) fn generate_valid_for(
    dns: &[String],
    ips: &[IpAddr],
    validity: time::Duration,
) -> Result<Generated, CertsError> {
    let now = time::OffsetDateTime::now_utc();
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "switchyard development CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = now - time::Duration::hours(1);
    ca.not_after = now + time::Duration::days(3650);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, &ca_key);

    let leaf_key = KeyPair::generate()?;
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name = DistinguishedName::new();
    let cn = dns.first().cloned().unwrap_or_else(|| "switchyard".into());
    leaf.distinguished_name.push(DnType::CommonName, cn);
    for name in dns {
        let host = name.strip_prefix("*.").unwrap_or(name);
        if !crate::api::is_dns1123_subdomain(&host.to_ascii_lowercase()) {
            return Err(CertsError::NotADnsName(name.clone()));
        }
        let san = name
            .as_str()
            .try_into()
            .map_err(|source| CertsError::BadName {
                name: name.clone(),
                source,
            })?;
        leaf.subject_alt_names.push(SanType::DnsName(san));
    }
    leaf.subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf.not_before = now - time::Duration::hours(1);
    leaf.not_after = now + validity;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;
    Ok(Generated {
        ca_cert_pem: ca_cert.pem(),
        cert_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`, creating it.
pub fn write(dir: &Path, g: &Generated) -> Result<(), CertsError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |error| CertsError::Write { path, error }
    };
    std::fs::create_dir_all(dir).map_err(err(dir))?;
    write_file(&dir.join("ca.crt"), &g.ca_cert_pem, 0o644)?;
    write_file(&dir.join("tls.crt"), &g.cert_pem, 0o644)?;
    write_file(&dir.join("tls.key"), &g.key_pem, 0o600)?;
    Ok(())
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), CertsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |error| CertsError::Write {
        path: path.to_path_buf(),
        error,
    };
    // Write beside and rename, so a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// A development certificate is replaced this long before it expires, so a restarted
/// `serve --dev-tls` never starts with one about to stop working.
pub(crate) const DEV_RENEW_BEFORE: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

/// Paths of a development certificate in `dir`, created unless a usable pair is already
/// there (so a restarted `serve --dev-tls` keeps the CA that clients trust). Usable: the key
/// matches, `ca.crt` signed the certificate, and it stays valid for localhost for at least
/// [`DEV_RENEW_BEFORE`]; otherwise a new CA and certificate replace them.
pub fn ensure_dev(dir: &Path) -> Result<(PathBuf, PathBuf), CertsError> {
    let (cert, key, ca) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
    if ca.exists() || cert.exists() {
        match reusable(&cert, &key, &ca) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "reusing the development certificate");
                return Ok((cert, key));
            }
            Err(why) => {
                tracing::warn!(dir = %dir.display(), reason = %why, "replacing the development CA and certificate; clients must trust the new ca.crt")
            }
        }
    }
    let (dns, ips) = default_names();
    write(dir, &generate(&dns, &ips)?)?;
    tracing::info!(dir = %dir.display(), ca = %ca.display(), "created a development CA and certificate for localhost and 127.0.0.1");
    Ok((cert, key))
}

/// Why the development pair in place cannot be served again, if it cannot.
fn reusable(cert: &Path, key: &Path, ca: &Path) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    let certified = crate::tls::load_certified_key(cert, key).map_err(|e| e.to_string())?;
    let ca_pem = std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca_pem) {
        let c = c.map_err(|e| format!("{}: {e}", ca.display()))?;
        roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()));
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
    let (leaf, intermediates) = certified
        .cert
        .split_first()
        .ok_or_else(|| format!("{} holds no certificate", cert.display()))?;
    let localhost = ServerName::try_from("localhost").expect("a valid DNS name");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let check = |at: std::time::Duration| {
        verifier.verify_server_cert(
            leaf,
            intermediates,
            &localhost,
            &[],
            UnixTime::since_unix_epoch(at),
        )
    };
    check(now).map_err(|e| {
        format!(
            "{} is not a valid certificate for localhost from {}: {e}",
            cert.display(),
            ca.display()
        )
    })?;
    check(now + DEV_RENEW_BEFORE).map_err(|e| {
        format!(
            "{} expires within {} days: {e}",
            cert.display(),
            DEV_RENEW_BEFORE.as_secs() / 86_400
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> (Vec<String>, Vec<IpAddr>) {
        default_names()
    }

    fn served(dir: &Path) -> String {
        let (cert, _) = ensure_dev(dir).unwrap();
        std::fs::read_to_string(cert).unwrap()
    }

    #[test]
    fn names_that_are_not_dns_names_are_refused_before_any_certificate() {
        crate::install_crypto_provider();
        for bad in ["not a dns!", "", "üñí.com", "a..b", "*.", "-x.svc"] {
            let err = generate(&[bad.to_string()], &[])
                .err()
                .map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.contains("is not a DNS name")),
                "{bad:?}: {err:?}"
            );
        }
        for good in [
            "*.switchyard-system.svc",
            "Switchyard.Example.com",
            "localhost",
        ] {
            assert!(generate(&[good.to_string()], &[]).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn dev_tls_reuses_only_a_valid_pair_signed_by_its_ca() {
        crate::install_crypto_provider();
        let (dns, ips) = names();

        // A fresh directory gets a pair, and a restart reuses it.
        let dir = tempfile::tempdir().unwrap();
        let first = served(dir.path());
        assert_eq!(served(dir.path()), first, "a good pair is reused");

        // Expiring within the renewal margin: replaced.
        let soon = generate_valid_for(&dns, &ips, time::Duration::days(3)).unwrap();
        write(dir.path(), &soon).unwrap();
        let renewed = served(dir.path());
        assert_ne!(
            renewed, soon.cert_pem,
            "a pair expiring in 3 days is replaced"
        );
        assert!(reusable(
            &dir.path().join("tls.crt"),
            &dir.path().join("tls.key"),
            &dir.path().join("ca.crt")
        )
        .is_ok());

        // Already expired: replaced.
        let expired = generate_valid_for(&dns, &ips, time::Duration::minutes(-5)).unwrap();
        write(dir.path(), &expired).unwrap();
        assert_ne!(served(dir.path()), expired.cert_pem);

        // Signed by some other CA than the ca.crt beside it: replaced.
        let mine = generate(&dns, &ips).unwrap();
        let other = generate(&dns, &ips).unwrap();
        write(dir.path(), &mine).unwrap();
        std::fs::write(dir.path().join("ca.crt"), &other.ca_cert_pem).unwrap();
        let replaced = served(dir.path());
        assert_ne!(
            replaced, mine.cert_pem,
            "a pair the CA did not sign is replaced"
        );
        let ca = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
        assert_ne!(ca, other.ca_cert_pem, "the CA is replaced with it");
    }
}
