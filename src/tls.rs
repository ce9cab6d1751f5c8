//! TLS for the HTTPS server: rustls with the ring provider, TLS 1.2 and 1.3, and a serving
//! certificate that is swapped in place when its files change.
//!
//! Kubernetes updates a mounted Secret by writing a new directory and atomically renaming the
//! `..data` symlink; watching the files themselves misses that. So the paths are re-read on a
//! timer and compared by content. A pair that fails to load (unreadable, key does not match)
//! is refused: the old one keeps serving, an error is logged once per bad content and counted.

use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no usable PEM private key: {message}")]
    BadKey { path: PathBuf, message: String },
    #[error("the key in {key} does not belong to the certificate in {cert}: {message}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("client CA {path}: {message}")]
    ClientCa { path: PathBuf, message: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.into(),
        source,
    })
}

/// Builds a certificate/key pair from PEM bytes, checking that the key matches.
pub fn certified_key_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::BadKey {
        path: key_path.into(),
        message: e.to_string(),
    })?;
    let signing_key =
        provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| TlsError::BadKey {
                path: key_path.into(),
                message: e.to_string(),
            })?;
    let certified = CertifiedKey::new(chain, signing_key);
    // ring exposes the public key of every key type it loads, so "unknown" is a failure too.
    certified.keys_match().map_err(|e| TlsError::Mismatch {
        cert: cert_path.into(),
        key: key_path.into(),
        message: e.to_string(),
    })?;
    Ok(certified)
}

pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    certified_key_from_pem(&read(cert)?, &read(key)?, cert, key)
}

/// The serving certificate, swappable while connections are open.
#[derive(Debug)]
pub struct CertificateStore {
    current: ArcSwap<CertifiedKey>,
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The bytes last seen on disk, to notice changes without parsing every tick.
#[derive(Default, PartialEq, Eq)]
struct SeenFiles {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl CertificateStore {
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, TlsError> {
        let key = load_certified_key(cert_path, key_path)?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(key),
            cert_path: cert_path.into(),
            key_path: key_path.into(),
        }))
    }

    /// The leaf certificate being served now.
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().cert.first().cloned()
    }

    /// Reads both files consistently: a kubelet swap between the two reads would pair an old
    /// certificate with a new key, so the certificate is read again and the pair retried if it
    /// changed meanwhile.
    fn read_pair(&self) -> Result<SeenFiles, TlsError> {
        let mut cert = read(&self.cert_path)?;
        for _ in 0..3 {
            let key = read(&self.key_path)?;
            let again = read(&self.cert_path)?;
            if again == cert {
                return Ok(SeenFiles { cert, key });
            }
            cert = again;
        }
        Ok(SeenFiles {
            key: read(&self.key_path)?,
            cert,
        })
    }

    /// Re-reads the files every `interval` until `shutdown` fires.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        metrics: Arc<Metrics>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut seen = self.read_pair().unwrap_or_default();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => return,
            }
            let store = self.clone();
            let files = match tokio::task::spawn_blocking(move || store.read_pair()).await {
                Ok(r) => r,
                Err(_) => continue,
            };
            let files = match files {
                Ok(f) => f,
                Err(e) => {
                    // A missing file is what a half-finished manual copy looks like; count it
                    // once, not every tick.
                    if seen != SeenFiles::default() {
                        tracing::error!(error = %e, "serving certificate could not be re-read; keeping the current one");
                        metrics.tls_reload("error");
                        seen = SeenFiles::default();
                    }
                    continue;
                }
            };
            if files == seen {
                continue;
            }
            match certified_key_from_pem(&files.cert, &files.key, &self.cert_path, &self.key_path) {
                Ok(key) => {
                    self.current.store(Arc::new(key));
                    metrics.tls_reload("success");
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                }
                Err(e) => {
                    metrics.tls_reload("error");
                    tracing::error!(error = %e, "new serving certificate refused; keeping the current one");
                }
            }
            seen = files;
        }
    }
}

/// The rustls server configuration: TLS 1.3 and 1.2, HTTP/1.1, certificates from `store`,
/// and client certificates required when `client_ca` is given.
pub fn server_config(
    store: Arc<CertificateStore>,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let pem = read(path)?;
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| TlsError::ClientCa {
                    path: path.into(),
                    message: e.to_string(),
                })?;
                roots.add(cert).map_err(|e| TlsError::ClientCa {
                    path: path.into(),
                    message: e.to_string(),
                })?;
            }
            if roots.is_empty() {
                return Err(TlsError::ClientCa {
                    path: path.into(),
                    message: "holds no PEM certificate".into(),
                });
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.into(),
                    message: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(store);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
