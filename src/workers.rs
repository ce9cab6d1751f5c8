//! Worker clusters: one robust connection per worker, its health, and (next) the watches
//! that feed the live inventory.
//!
//! Decisions are pure (`kubeconfig::check`, `ConnectionState`); the I/O around them builds
//! clients and probes them with bounded timeouts, so a worker that hangs never delays another.

pub mod connection;
pub mod hub;
pub mod kubeconfig;
pub mod live;
pub mod ratelimit;
pub mod virtual_node;
pub mod watch;

pub use connection::{Backoff, ConnectionState, Health, Reason};
pub use kubeconfig::{check, client_for, probe, KubeconfigError};
pub use ratelimit::RateLimiter;
