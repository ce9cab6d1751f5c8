//! Switchyard: a multi-cluster batch dispatcher for Kubernetes.
//!
//! One binary serves three surfaces on one HTTPS server: admission webhooks for batch/v1 Jobs,
//! a kube-scheduler extender and the dispatcher. Decision logic lives in pure functions
//! (plain data in, plain data out); the modules named after I/O (`server`, `tls`,
//! `namespaces`) are thin shells around them.
#![forbid(unsafe_code)]
// The library is Switchyard's own, read by its developers with `--document-private-items`:
// its public items' docs may point at the private ones that do the work.
#![allow(rustdoc::private_intra_doc_links)]

pub mod api;
pub mod certs;
pub mod cli;
pub mod config;
pub mod dispatcher;
pub mod explain;
pub mod extender;
pub mod inventory;
pub mod leader;
pub mod metrics;
pub mod namespaces;
pub mod placement;
pub mod quantity;
pub mod rbac;
pub mod register;
pub mod rng;
pub mod selector;
pub mod server;
pub mod simulate;
pub mod telemetry;
pub mod text;
pub mod tls;
pub mod topology;
pub mod unread;
pub mod webhook;
pub mod wellknown;
pub mod workers;

/// Errors that end a command. Each message names the object and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Certs(#[from] certs::CertsError),
    // The I/O error is said in the message, with a hint after it: not a `source` as well,
    // or the one-line error would say it twice.
    #[error("cannot listen on {addr}: {error}{}", listen_hint(.error))]
    Listen {
        addr: std::net::SocketAddr,
        error: std::io::Error,
    },
    #[error("cannot build a Kubernetes client: {0}; set KUBECONFIG or run in a pod, or pass --standalone to run without a cluster")]
    KubeClient(String),
    #[error(transparent)]
    Inventory(#[from] inventory::InventoryError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to check when listening failed, for the failures a user can fix.
fn listen_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; is another process using the port (or are listen and probeListen the same)?"
        }
        std::io::ErrorKind::AddrNotAvailable => "; the address is not one of this machine's",
        std::io::ErrorKind::PermissionDenied => "; ports below 1024 need privileges",
        _ => "",
    }
}

/// Installs ring as the process-wide rustls provider. Idempotent: tests call it from many
/// threads, and a second install attempt only reports that one is already there.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
