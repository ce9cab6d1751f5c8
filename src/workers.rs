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
pub(crate) mod kubeconfig;
pub(crate) mod link;
pub mod live;
pub(crate) mod ratelimit;
pub mod registry;
pub(crate) mod source;
pub(crate) mod status;
pub mod virtual_node;
pub mod watch;

pub use connection::Backoff;
pub(crate) use connection::ConnectionState;
pub use controller::ControllerOptions;
pub use kubeconfig::{check, client_for, probe, ClientOptions};
pub use link::LinkOptions;
pub use ratelimit::RateLimiter;
pub use registry::{WorkerView, Workers, WorkersPublisher};
