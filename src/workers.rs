//! Worker clusters: the WorkerCluster controller, one robust connection per worker (its own
//! task, its own rate-limited client), the watches that feed the live inventory, the views
//! the dispatcher reads, and one virtual node per worker in the manager cluster.
//!
//! Decisions are pure (`kubeconfig::check`, `ConnectionState`, `status::desired`); the I/O
//! around them builds clients and probes them with bounded timeouts, so a worker that hangs
//! never delays another.

pub mod connection;
pub mod controller;
pub mod hub;
pub mod kubeconfig;
pub mod link;
pub mod live;
pub mod ratelimit;
pub mod registry;
pub mod source;
pub mod status;
pub mod virtual_node;
pub mod watch;

pub use connection::{Backoff, ConnectionState, Health, Reason};
pub use controller::ControllerOptions;
pub use kubeconfig::{check, client_for, probe, ClientOptions, KubeconfigError};
pub use link::LinkOptions;
pub use ratelimit::{RateLimitLayer, RateLimiter};
pub use registry::{WorkerView, Workers, WorkersPublisher};
