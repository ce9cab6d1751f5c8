//! Policies, policy options and the start-up checks the kubelet performs on them.

use std::fmt;
use std::str::FromStr;

use super::{NumaInfo, NumaMask};

/// Option name enabling the distance-aware tie break.
pub(crate) const PREFER_CLOSEST_NUMA_NODES: &str = "prefer-closest-numa-nodes";
/// Option name raising the NUMA node limit.
pub(crate) const MAX_ALLOWABLE_NUMA_NODES: &str = "max-allowable-numa-nodes";
/// The kubelet's NUMA node limit, which the option may raise but not lower.
pub(crate) const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: usize = 8;

/// Why the kubelet would refuse to start with a configuration (or, for
/// [`ConfigError::InvalidNumaId`], why an input cannot be represented).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown policy: {0:?}")]
    UnknownPolicy(String),
    #[error("unknown Topology Manager Policy option: {0:?}")]
    UnknownOption(String),
    #[error("bad value for option {name:?}: {value}")]
    BadOptionValue { name: String, value: String },
    #[error("the minimum value of \"max-allowable-numa-nodes\" should not be less than {DEFAULT_MAX_ALLOWABLE_NUMA_NODES}, got {0}")]
    MaxAllowableTooSmall(i64),
    #[error("cannot discover NUMA topology: no distances for NUMA node {0}")]
    MissingDistances(u32),
    #[error("cannot discover NUMA topology: distance row of NUMA node {node} has {len} entries, node ids go up to {max_id}")]
    ShortDistanceRow { node: u32, len: usize, max_id: u32 },
    #[error("unsupported on machines with more than {max} NUMA Nodes (found {found})")]
    TooManyNumaNodes { found: usize, max: usize },
    #[error("NUMA node id {0} is outside 0..=63")]
    InvalidNumaId(i64),
}

/// The Topology Manager policy (`--topology-manager-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl Policy {
    /// The kubelet's spelling of the policy.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::BestEffort => "best-effort",
            Policy::Restricted => "restricted",
            Policy::SingleNumaNode => "single-numa-node",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        [
            Policy::None,
            Policy::BestEffort,
            Policy::Restricted,
            Policy::SingleNumaNode,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| ConfigError::UnknownPolicy(s.to_owned()))
    }
}

/// Parsed `--topology-manager-policy-options`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyOptions {
    /// Break ties between equally wide masks by average NUMA distance
    /// (best-effort and restricted only).
    pub prefer_closest_numa: bool,
    pub max_allowable_numa_nodes: usize,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            prefer_closest_numa: false,
            max_allowable_numa_nodes: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
        }
    }
}

impl PolicyOptions {
    /// Parses options given as the kubelet receives them: name/value strings.
    #[cfg(test)]
    pub(crate) fn from_pairs<'a, I>(pairs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut opts = Self::default();
        for (name, value) in pairs {
            opts.set(name, value)?;
        }
        Ok(opts)
    }

    /// Applies one option given as strings.
    pub(crate) fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let bad = || ConfigError::BadOptionValue {
            name: name.to_owned(),
            value: value.to_owned(),
        };
        match name {
            PREFER_CLOSEST_NUMA_NODES => {
                self.prefer_closest_numa = parse_go_bool(value).ok_or_else(bad)?;
            }
            MAX_ALLOWABLE_NUMA_NODES => {
                let n: i64 = value.trim().parse().map_err(|_| bad())?;
                self.set_max_allowable(n)?;
            }
            _ => return Err(ConfigError::UnknownOption(name.to_owned())),
        }
        Ok(())
    }

    /// Sets `max-allowable-numa-nodes`, refusing values below the default.
    pub(crate) fn set_max_allowable(&mut self, n: i64) -> Result<(), ConfigError> {
        match usize::try_from(n) {
            Ok(v) if v >= DEFAULT_MAX_ALLOWABLE_NUMA_NODES => {
                self.max_allowable_numa_nodes = v;
                Ok(())
            }
            _ => Err(ConfigError::MaxAllowableTooSmall(n)),
        }
    }
}

/// Go's `strconv.ParseBool`, which is how the kubelet reads boolean options.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The checks the kubelet makes when it builds its Topology Manager.
///
/// Options and NUMA distances are checked for every policy; the node limit
/// only applies to policies other than `none`. One check goes beyond the
/// kubelet: a distance row too short to index by every node id is refused
/// here, where the kubelet would crash on it later, mid-merge.
pub fn validate(
    policy: Policy,
    options: &PolicyOptions,
    numa_info: &NumaInfo,
) -> Result<(), ConfigError> {
    if options.max_allowable_numa_nodes < DEFAULT_MAX_ALLOWABLE_NUMA_NODES {
        let n = i64::try_from(options.max_allowable_numa_nodes).unwrap_or(i64::MAX);
        return Err(ConfigError::MaxAllowableTooSmall(n));
    }
    if let Some(&bad) = numa_info.nodes.iter().find(|&&id| id > NumaMask::MAX_ID) {
        return Err(ConfigError::InvalidNumaId(i64::from(bad)));
    }
    if options.prefer_closest_numa {
        let max_id = numa_info.nodes.iter().copied().max().unwrap_or(0);
        for &node in &numa_info.nodes {
            let row = numa_info
                .distances
                .get(&node)
                .ok_or(ConfigError::MissingDistances(node))?;
            if row.len() <= max_id as usize {
                return Err(ConfigError::ShortDistanceRow {
                    node,
                    len: row.len(),
                    max_id,
                });
            }
        }
    }
    if policy != Policy::None && numa_info.nodes.len() > options.max_allowable_numa_nodes {
        return Err(ConfigError::TooManyNumaNodes {
            found: numa_info.nodes.len(),
            max: options.max_allowable_numa_nodes,
        });
    }
    Ok(())
}
