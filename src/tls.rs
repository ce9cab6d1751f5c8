//! TLS for the HTTPS server: rustls with the ring provider, TLS 1.2 and 1.3, and a serving
//! certificate that is swapped in place when its files change.
//!
//! Kubernetes updates a mounted Secret by writing a new directory and atomically renaming the
//! `..data` symlink; watching the files themselves misses that. So the paths are re-read on a
//! timer and compared by content. A pair that fails to load (unreadable, key does not match)
//! is refused: the old one keeps serving, and an error is logged and counted once per bad
//! content, or once per spell of files that cannot be read.

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
pub(crate) fn certified_key_from_pem(
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
pub(crate) struct CertificateStore {
    current: ArcSwap<CertifiedKey>,
    cert_path: PathBuf,
    key_path: PathBuf,
    /// The file contents `current` was built from, so the watcher starts from what is
    /// served rather than from a second read that could fail unnoticed.
    loaded: SeenFiles,
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The bytes last seen on disk, to notice changes without parsing every tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SeenFiles {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// How many times the certificate is read around the key before a pair counts as unsettled.
const PAIR_READ_ATTEMPTS: usize = 3;

/// Reads the certificate and key consistently: a kubelet swap between the two reads would
/// pair an old certificate with a new key, so the certificate is read again after the key
/// and the pair kept only when it did not change meanwhile. `Ok(None)`: the files kept
/// changing (a swap in progress), which is no error; try again shortly.
fn read_consistent(
    cert_path: &Path,
    key_path: &Path,
    read: &mut dyn FnMut(&Path) -> Result<Vec<u8>, TlsError>,
) -> Result<Option<SeenFiles>, TlsError> {
    let mut cert = read(cert_path)?;
    for _ in 0..PAIR_READ_ATTEMPTS {
        let key = read(key_path)?;
        let again = read(cert_path)?;
        if again == cert {
            return Ok(Some(SeenFiles { cert, key }));
        }
        cert = again;
    }
    Ok(None)
}

impl CertificateStore {
    pub(crate) fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, TlsError> {
        let files = read_consistent(cert_path, key_path, &mut |p| read(p))?.ok_or_else(|| {
            TlsError::Read {
                path: cert_path.into(),
                source: std::io::Error::other("the file kept changing while it was read"),
            }
        })?;
        let key = certified_key_from_pem(&files.cert, &files.key, cert_path, key_path)?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(key),
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            loaded: files,
        }))
    }

    /// The leaf certificate being served now.
    #[cfg(test)]
    pub(crate) fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().cert.first().cloned()
    }

    fn read_pair(&self) -> Result<Option<SeenFiles>, TlsError> {
        read_consistent(&self.cert_path, &self.key_path, &mut |p| read(p))
    }

    /// Re-reads the files every `interval` until `shutdown` fires.
    ///
    /// Each bad state is logged and counted once: a read error when reading starts to fail,
    /// a refused pair once per content. The pair being served reappearing after an error is
    /// not a reload.
    pub(crate) async fn watch(
        self: Arc<Self>,
        interval: Duration,
        metrics: Arc<Metrics>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        // What is on disk as last read, and what the served certificate was built from: after a
        // refused pair or a read error, the served pair reappearing is no reload.
        let mut seen = self.loaded.clone();
        let mut served = self.loaded.clone();
        let mut read_failing = false;
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
                Ok(Some(f)) => f,
                Ok(None) => {
                    // Mid-swap: look again soon rather than a whole interval later.
                    tracing::debug!(cert = %self.cert_path.display(), "certificate files changing; reading again shortly");
                    ticker.reset_after(interval.min(Duration::from_millis(200)));
                    continue;
                }
                Err(e) => {
                    if !read_failing {
                        tracing::error!(error = %e, "serving certificate could not be re-read; keeping the current one");
                        metrics.tls_reload("error");
                        read_failing = true;
                    }
                    continue;
                }
            };
            if read_failing {
                tracing::info!(cert = %self.cert_path.display(), "serving certificate files readable again");
                read_failing = false;
            }
            if files == seen {
                continue;
            }
            if files == served {
                tracing::info!(cert = %self.cert_path.display(), "certificate files are back to the pair being served");
                seen = files;
                continue;
            }
            match certified_key_from_pem(&files.cert, &files.key, &self.cert_path, &self.key_path) {
                Ok(key) => {
                    self.current.store(Arc::new(key));
                    metrics.tls_reload("success");
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                    served = files.clone();
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
pub(crate) fn server_config(
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn pem_pair() -> (String, String) {
        let g = crate::certs::generate(&["localhost".into()], &[]).unwrap();
        (g.cert_pem, g.key_pem)
    }

    #[test]
    fn a_pair_is_read_only_when_the_certificate_held_still_around_the_key() {
        let (cert, key) = (Path::new("/c"), Path::new("/k"));
        // Steady files: one pair.
        let mut steady = |p: &Path| {
            Ok(if p == cert {
                b"c1".to_vec()
            } else {
                b"k1".to_vec()
            })
        };
        assert_eq!(
            read_consistent(cert, key, &mut steady).unwrap(),
            Some(SeenFiles {
                cert: b"c1".to_vec(),
                key: b"k1".to_vec()
            })
        );
        // A swap between the key and the second certificate read: read again, paired.
        let mut reads: HashMap<&Path, usize> = HashMap::new();
        let mut swapping_once = |p: &Path| {
            let n = reads.entry(if p == cert { cert } else { key }).or_default();
            *n += 1;
            Ok(match (p == cert, *n) {
                (true, 1) => b"c1".to_vec(),
                (true, _) => b"c2".to_vec(),
                (false, 1) => b"k1".to_vec(),
                (false, _) => b"k2".to_vec(),
            })
        };
        assert_eq!(
            read_consistent(cert, key, &mut swapping_once).unwrap(),
            Some(SeenFiles {
                cert: b"c2".to_vec(),
                key: b"k2".to_vec()
            })
        );
        // Files that never hold still: no pair at all, rather than a mismatched one.
        let mut n = 0;
        let mut churning = |p: &Path| {
            n += 1;
            Ok(format!("{}{n}", if p == cert { "c" } else { "k" }).into_bytes())
        };
        assert_eq!(read_consistent(cert, key, &mut churning).unwrap(), None);
    }

    #[tokio::test]
    async fn files_gone_right_after_start_are_logged_and_counted_once() {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let (cert_pem, key_pem) = pem_pair();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &cert_pem).unwrap();
        std::fs::write(&key, &key_pem).unwrap();
        let store = CertificateStore::load(&cert, &key).unwrap();
        let served = store.current_leaf();
        std::fs::remove_file(&key).unwrap();

        let metrics = Arc::new(Metrics::new());
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(store.clone().watch(
            Duration::from_millis(20),
            metrics.clone(),
            stop_rx,
        ));
        let counted = |m: &Metrics, result: &str, n: u32| {
            m.encode().contains(&format!(
                "switchyard_tls_reloads_total{{result=\"{result}\"}} {n}"
            ))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !counted(&metrics, "error", 1) {
            assert!(
                std::time::Instant::now() < deadline,
                "a read failure right after start was never counted:\n{}",
                metrics.encode()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Many more failing ticks: still one error. The same pair back: not a reload.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(counted(&metrics, "error", 1), "{}", metrics.encode());
        std::fs::write(&key, &key_pem).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(counted(&metrics, "success", 0), "{}", metrics.encode());
        assert!(counted(&metrics, "error", 1), "{}", metrics.encode());
        assert_eq!(store.current_leaf(), served);
        let _ = stop.send(true);
        task.await.unwrap();
    }
}
