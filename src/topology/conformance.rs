//! The JSON case/result format of the shared Topology Manager vectors
//! (`conformance/topology/FORMAT.md`), and a runner over it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::merge::{reach_nodes, MACHINE_DENSE_BITS};
use super::{
    merge, validate, ConfigError, NumaInfo, NumaMask, Policy, PolicyOptions, ProviderHints,
    TopologyHint, MAX_ALLOWABLE_NUMA_NODES, PREFER_CLOSEST_NUMA_NODES,
};

/// One provider: `null` and `{}` both mean "no preference for anything".
pub(crate) type CaseProvider = Option<BTreeMap<String, Option<Vec<CaseHint>>>>;

/// A merge to perform, with the machine and configuration it runs under.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Case {
    pub(crate) policy: String,
    /// Option name to value; a `null` value counts as not given.
    #[serde(default)]
    pub(crate) options: Option<BTreeMap<String, Value>>,
    /// Kept signed so that a negative id is reported, not a parse failure.
    pub(crate) numa_nodes: Vec<i64>,
    /// NUMA id (as a string) to its row, indexed by NUMA id.
    #[serde(default)]
    pub(crate) distances: Option<BTreeMap<String, Option<Vec<u64>>>>,
    #[serde(default)]
    pub(crate) providers: Option<Vec<CaseProvider>>,
}

/// One hint: `numa` absent or `null` is no affinity; `[]` is an empty mask.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct CaseHint {
    #[serde(default)]
    pub(crate) numa: Option<Vec<i64>>,
    #[serde(default)]
    pub(crate) preferred: bool,
}

/// The merged hint, the admission decision, or the configuration error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CaseResult {
    /// Ascending NUMA ids; `None` when the hint has no affinity.
    pub(crate) affinity: Option<Vec<u32>>,
    pub(crate) preferred: bool,
    pub(crate) admit: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

impl CaseResult {
    fn failed(message: String) -> Self {
        Self {
            affinity: None,
            preferred: false,
            admit: false,
            error: Some(message),
        }
    }

    /// Whether `self` (got) matches `expected`: for errors only whether
    /// one is present counts, not its text.
    #[cfg(test)]
    pub(crate) fn agrees_with(&self, expected: &CaseResult) -> bool {
        self.affinity == expected.affinity
            && self.preferred == expected.preferred
            && self.admit == expected.admit
            && self.error.is_some() == expected.error.is_some()
    }
}

/// A case turned into the arguments of [`merge()`].
#[derive(Clone, Debug)]
pub(crate) struct MergeInput {
    pub(crate) policy: Policy,
    pub(crate) options: PolicyOptions,
    pub(crate) numa_info: NumaInfo,
    pub(crate) providers: Vec<ProviderHints>,
}

impl Case {
    /// Parses the case and applies the kubelet's start-up checks.
    pub(crate) fn to_merge_input(&self) -> Result<MergeInput, ConfigError> {
        let policy: Policy = self.policy.parse()?;
        let options = parse_options(self.options.as_ref())?;
        let nodes = self
            .numa_nodes
            .iter()
            .map(|&id| numa_id(id))
            .collect::<Result<Vec<_>, _>>()?;
        let numa_info = NumaInfo::with_distances(nodes, parse_distances(self.distances.as_ref()));
        validate(policy, &options, &numa_info)?;
        let providers = self
            .providers
            .iter()
            .flatten()
            .map(parse_provider)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MergeInput {
            policy,
            options,
            numa_info,
            providers,
        })
    }
}

/// Runs one case: the kubelet's start-up checks, then its merge.
pub(crate) fn run_case(case: &Case) -> CaseResult {
    match case.to_merge_input() {
        Ok(input) if beyond_reach(&input) => CaseResult::failed(format!(
            "{} NUMA nodes and {:.3e} combinations of hints: where the hints name more than {} NUMA nodes, switchyard merges at most {} combinations (the kubelet tries every one)",
            input.numa_info.nodes.len(),
            combinations(&input.providers),
            MACHINE_DENSE_BITS,
            SPARSE_COMBINATIONS
        )),
        Ok(input) => {
            let out = merge(
                input.policy,
                &input.options,
                &input.numa_info,
                &input.providers,
            );
            CaseResult {
                affinity: out.hint.affinity.map(|m| m.ids().collect()),
                preferred: out.hint.preferred,
                admit: out.admit,
                error: None,
            }
        }
        Err(e) => CaseResult::failed(e.to_string()),
    }
}

/// Most combinations of hints merged on a machine of more than [`MACHINE_DENSE_BITS`] NUMA
/// nodes, where the reachable masks are found pair by pair: 2^24 take well under a second.
/// Past both, the merge could take hours, as the kubelet's would.
const SPARSE_COMBINATIONS: f64 = (1u64 << 24) as f64;

/// Whether merging the case would take longer than anyone waits for an answer: its hints
/// name more than [`MACHINE_DENSE_BITS`] of the machine's nodes (counting one for those they
/// do not name), too many for the tables, and pairing them would take too long.
fn beyond_reach(input: &MergeInput) -> bool {
    let affinities = (input.providers.iter().flat_map(|p| p.values()))
        .flatten()
        .flatten()
        .filter_map(|h| h.affinity);
    let (named, stand_in) = reach_nodes(input.numa_info.default_mask().bits(), affinities);
    (named | stand_in).count_ones() > MACHINE_DENSE_BITS
        && combinations(&input.providers) > SPARSE_COMBINATIONS
}

/// How many ways there are to take one hint per resource (a resource without hints, or
/// without preference, counts once).
fn combinations(providers: &[ProviderHints]) -> f64 {
    (providers.iter().flat_map(|p| p.values()))
        .map(|hints| hints.as_ref().map_or(1, |h| h.len().max(1)) as f64)
        .product()
}

fn numa_id(id: i64) -> Result<u32, ConfigError> {
    u32::try_from(id)
        .ok()
        .filter(|&v| v <= NumaMask::MAX_ID)
        .ok_or(ConfigError::InvalidNumaId(id))
}

fn parse_options(raw: Option<&BTreeMap<String, Value>>) -> Result<PolicyOptions, ConfigError> {
    let mut opts = PolicyOptions::default();
    for (name, value) in raw.into_iter().flatten() {
        let bad = || ConfigError::BadOptionValue {
            name: name.clone(),
            value: value.to_string(),
        };
        match (name.as_str(), value) {
            (_, Value::Null) => {}
            // Strings go through the kubelet's own parsing of option values.
            (_, Value::String(s)) => opts.set(name, s)?,
            (PREFER_CLOSEST_NUMA_NODES, Value::Bool(b)) => opts.prefer_closest_numa = *b,
            (MAX_ALLOWABLE_NUMA_NODES, Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
                (Some(v), _) => opts.set_max_allowable(v)?,
                (None, Some(v)) => {
                    opts.max_allowable_numa_nodes = usize::try_from(v).unwrap_or(usize::MAX);
                }
                _ => return Err(bad()),
            },
            (PREFER_CLOSEST_NUMA_NODES | MAX_ALLOWABLE_NUMA_NODES, _) => return Err(bad()),
            _ => return Err(ConfigError::UnknownOption(name.clone())),
        }
    }
    Ok(opts)
}

/// Rows under keys that are not NUMA ids could never be looked up, and
/// `null` rows are missing rows; both are left out.
fn parse_distances(raw: Option<&BTreeMap<String, Option<Vec<u64>>>>) -> BTreeMap<u32, Vec<u64>> {
    raw.into_iter()
        .flatten()
        .filter_map(|(key, row)| Some((key.trim().parse::<u32>().ok()?, row.clone()?)))
        .collect()
}

fn parse_provider(raw: &CaseProvider) -> Result<ProviderHints, ConfigError> {
    let mut provider = ProviderHints::new();
    for (resource, hints) in raw.iter().flatten() {
        let hints = match hints {
            None => None,
            Some(list) => Some(list.iter().map(parse_hint).collect::<Result<Vec<_>, _>>()?),
        };
        provider.insert(resource.clone(), hints);
    }
    Ok(provider)
}

fn parse_hint(raw: &CaseHint) -> Result<TopologyHint, ConfigError> {
    let affinity = match &raw.numa {
        None => None,
        Some(ids) => Some(NumaMask::from_ids(
            ids.iter()
                .map(|&id| numa_id(id))
                .collect::<Result<Vec<_>, _>>()?,
        )?),
    };
    Ok(TopologyHint {
        affinity,
        preferred: raw.preferred,
    })
}

/// Maps a JSON array of cases to the JSON array of their results, one result
/// per line. A case that does not fit the format gets an `error` result, so
/// results stay aligned with cases; only input that is not a JSON array of
/// values is an `Err`.
pub fn run_cases(input: &str) -> Result<String, serde_json::Error> {
    let cases: Vec<Value> = serde_json::from_str(input)?;
    let mut out = String::from("[");
    for (i, raw) in cases.into_iter().enumerate() {
        let result = match serde_json::from_value::<Case>(raw) {
            Ok(case) => run_case(&case),
            Err(e) => CaseResult::failed(format!("invalid case: {e}")),
        };
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        out.push_str(&serde_json::to_string(&result)?);
    }
    out.push_str("\n]\n");
    Ok(out)
}

/// A vector whose result differs from the expected one.
#[cfg(test)]
#[derive(Clone, Debug)]
pub(crate) struct Disagreement {
    /// Position of the vector in its file.
    pub(crate) index: usize,
    pub(crate) case: Value,
    pub(crate) expected: CaseResult,
    pub(crate) got: CaseResult,
}

/// Outcome of running a vector file.
#[cfg(test)]
#[derive(Clone, Debug, Default)]
pub(crate) struct VectorReport {
    pub(crate) total: usize,
    pub(crate) disagreements: Vec<Disagreement>,
}

#[derive(Deserialize)]
#[cfg(test)]
struct Vector {
    case: Value,
    expected: CaseResult,
}

/// Runs a vector file (a JSON array of `{"case", "expected"}`) and lists the
/// vectors whose result disagrees with the expected one.
#[cfg(test)]
pub(crate) fn check_vectors(input: &str) -> Result<VectorReport, serde_json::Error> {
    let vectors: Vec<Vector> = serde_json::from_str(input)?;
    let mut report = VectorReport {
        total: vectors.len(),
        disagreements: Vec::new(),
    };
    for (index, v) in vectors.into_iter().enumerate() {
        let got = match serde_json::from_value::<Case>(v.case.clone()) {
            Ok(case) => run_case(&case),
            Err(e) => CaseResult::failed(format!("invalid case: {e}")),
        };
        if !got.agrees_with(&v.expected) {
            report.disagreements.push(Disagreement {
                index,
                case: v.case,
                expected: v.expected,
                got,
            });
        }
    }
    Ok(report)
}
