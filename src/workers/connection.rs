//! A worker's connection health, as a pure state machine with time as a parameter.
//!
//! "Disconnected since T" keeps the first failure's T across retries and across kubeconfig
//! errors: the dispatcher's worker-lost timeout counts from it, and only a successful
//! connection resets it.

use crate::api::cluster_reason;
use std::time::{Duration, SystemTime};

/// Why a worker is not usable; the `Active` condition's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    Connected,
    BadKubeConfig,
    InsecureKubeConfig,
    ClientConnectionFailed,
    Stale,
    InvalidSpec,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Connected => cluster_reason::CONNECTED,
            Reason::BadKubeConfig => cluster_reason::BAD_KUBE_CONFIG,
            Reason::InsecureKubeConfig => cluster_reason::INSECURE_KUBE_CONFIG,
            Reason::ClientConnectionFailed => cluster_reason::CLIENT_CONNECTION_FAILED,
            Reason::Stale => cluster_reason::STALE,
            Reason::InvalidSpec => cluster_reason::INVALID_SPEC,
        }
    }

    /// The reason a status names, if it is one of these.
    pub(crate) fn parse(s: &str) -> Option<Reason> {
        [
            Reason::Connected,
            Reason::BadKubeConfig,
            Reason::InsecureKubeConfig,
            Reason::ClientConnectionFailed,
            Reason::Stale,
            Reason::InvalidSpec,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }

    /// Whether the worker is unreachable (or unusable) for this reason, as opposed to
    /// connected but behind.
    pub(crate) fn is_disconnection(self) -> bool {
        !matches!(self, Reason::Connected | Reason::Stale)
    }
}

/// Retry delays: from `base`, doubling, capped at `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(5),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay after the `attempt`-th consecutive failure (1-based).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Health {
    /// Never connected yet.
    Connecting,
    Connected {
        since: SystemTime,
    },
    Disconnected {
        since: SystemTime,
        attempts: u32,
        reason: Reason,
        message: String,
        next_attempt: SystemTime,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct ConnectionState {
    pub(crate) health: Health,
    pub(crate) backoff: Backoff,
}

impl ConnectionState {
    #[cfg(test)]
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            health: Health::Connecting,
            backoff,
        }
    }

    pub(crate) fn connected(&mut self, now: SystemTime) {
        if !matches!(self.health, Health::Connected { .. }) {
            self.health = Health::Connected { since: now };
        }
    }

    /// Records a failure; returns how long to wait before the next attempt.
    pub(crate) fn failed(&mut self, now: SystemTime, reason: Reason, message: String) -> Duration {
        let (since, attempts) = match &self.health {
            Health::Disconnected {
                since, attempts, ..
            } => (*since, attempts + 1),
            Health::Connecting | Health::Connected { .. } => (now, 1),
        };
        let delay = self.backoff.delay(attempts);
        self.health = Health::Disconnected {
            since,
            attempts,
            reason,
            message,
            next_attempt: now + delay,
        };
        delay
    }

    #[cfg(test)]
    pub(crate) fn is_connected(&self) -> bool {
        matches!(self.health, Health::Connected { .. })
    }

    /// When the worker was last lost, if it is disconnected now.
    pub(crate) fn disconnected_since(&self) -> Option<SystemTime> {
        match &self.health {
            Health::Disconnected { since, .. } => Some(*since),
            _ => None,
        }
    }

    /// The `Active` condition: status, reason and message.
    pub(crate) fn condition(&self) -> (&'static str, &'static str, String) {
        match &self.health {
            Health::Connecting => (
                "Unknown",
                crate::api::cluster_reason::CONNECTING,
                "first connection attempt in progress".into(),
            ),
            Health::Connected { .. } => ("True", Reason::Connected.as_str(), "connected".into()),
            Health::Disconnected {
                attempts,
                reason,
                message,
                next_attempt,
                ..
            } => (
                "False",
                reason.as_str(),
                format!(
                    "attempt {attempts} failed: {message}; next attempt at {}",
                    httpdate(*next_attempt)
                ),
            ),
        }
    }
}

/// RFC 3339 in UTC, seconds precision.
pub fn httpdate(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|d| {
            d.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5s_to_5m() {
        let b = Backoff::default();
        let delays: Vec<u64> = (1..=9).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.delay(200).as_secs(), 300);
    }

    #[test]
    fn disconnected_since_survives_retries_and_config_errors_until_a_success() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut c = ConnectionState::new(Backoff::default());
        c.connected(t0);
        let lost = t0 + Duration::from_secs(60);
        assert_eq!(
            c.failed(lost, Reason::ClientConnectionFailed, "refused".into())
                .as_secs(),
            5
        );
        let later = lost + Duration::from_secs(5);
        assert_eq!(
            c.failed(later, Reason::BadKubeConfig, "rotated badly".into())
                .as_secs(),
            10
        );
        assert_eq!(c.disconnected_since(), Some(lost));
        let (status, reason, message) = c.condition();
        assert_eq!((status, reason), ("False", "BadKubeConfig"));
        assert!(
            message.starts_with("attempt 2 failed: rotated badly; next attempt at 2027-"),
            "{message}"
        );
        c.connected(later + Duration::from_secs(10));
        assert!(c.is_connected());
        assert_eq!(c.disconnected_since(), None);
        // A new loss starts a new count.
        c.failed(
            later + Duration::from_secs(20),
            Reason::Stale,
            "no events".into(),
        );
        assert_eq!(
            c.disconnected_since(),
            Some(later + Duration::from_secs(20))
        );
    }
}
