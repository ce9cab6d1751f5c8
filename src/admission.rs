//! admission.k8s.io/v1 AdmissionReview handling for batch/v1 Jobs.
//!
//! The HTTP layer hands a raw body to [`parse`], looks up whatever [`Review::namespace_to_look_up`]
//! asks for, and calls [`decide`]: a pure function of the review, the policy and the
//! Namespace's labels. [`render`] turns the decision into the reply body.
//!
//! Only the fields the rules read are parsed; the Job itself is never re-serialised, so fields
//! this code does not know (the API server is newer than we are) are neither denied nor dropped:
//! the reply is a JSONPatch that touches only what it changes.

mod job;
#[cfg(test)]
mod tests;

pub use job::{is_dns1123_label, JobView};

use crate::selector;
use crate::wellknown::{DEFAULT_DISPATCHER_USERNAME, QUEUE_LABEL};
use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// Which of the two webhooks a review was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Mutate,
    Validate,
}

impl Hook {
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Mutate => "mutate",
            Hook::Validate => "validate",
        }
    }
}

/// The admission rules' configuration.
#[derive(Debug, Clone)]
pub struct AdmissionPolicy {
    /// Queue given to unlabelled Jobs in namespaces matching `managed_namespaces`.
    pub default_queue: Option<String>,
    /// Namespaces whose unlabelled Jobs get `default_queue`. Unset means none: a nil selector
    /// selects nothing in Kubernetes, and silently capturing every namespace's Jobs would be
    /// the worse surprise.
    pub managed_namespaces: Option<LabelSelector>,
    /// Users allowed to unsuspend a Job of ours: the dispatcher's identity.
    pub dispatcher_usernames: Vec<String>,
}

impl Default for AdmissionPolicy {
    fn default() -> Self {
        Self {
            default_queue: None,
            managed_namespaces: None,
            dispatcher_usernames: vec![DEFAULT_DISPATCHER_USERNAME.to_string()],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "CREATE" => Some(Self::Create),
            "UPDATE" => Some(Self::Update),
            "DELETE" => Some(Self::Delete),
            "CONNECT" => Some(Self::Connect),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
        }
    }
}

/// A review whose request could be read; decisions are made on this.
#[derive(Debug)]
pub struct Review {
    pub envelope: Envelope,
    pub operation: Operation,
    pub sub_resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub username: String,
    pub dry_run: bool,
    pub object: Option<JobView>,
    pub old_object: Option<JobView>,
}

/// What every reply echoes: the review's `apiVersion`, `kind` and `request.uid`.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub api_version: String,
    pub kind: String,
    pub uid: String,
}

/// Why a body is not a usable review.
#[derive(Debug, Clone, PartialEq)]
pub enum BadReview {
    /// Not even the request uid is known: the HTTP layer answers 400 with this line.
    Unreadable(String),
    /// The uid is known: answered with an AdmissionResponse that denies with this reason.
    Rejected {
        envelope: EnvelopeEcho,
        message: String,
    },
}

/// [`Envelope`] in a form that can be compared in tests.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvelopeEcho {
    pub api_version: String,
    pub kind: String,
    pub uid: String,
}

impl From<EnvelopeEcho> for Envelope {
    fn from(e: EnvelopeEcho) -> Self {
        Envelope {
            api_version: e.api_version,
            kind: e.kind,
            uid: e.uid,
        }
    }
}

#[derive(Deserialize)]
struct WireReview<'a> {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(borrow)]
    request: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireUid {
    uid: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest<'a> {
    kind: Option<WireGvk>,
    operation: Option<String>,
    sub_resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    #[serde(default)]
    user_info: WireUserInfo,
    #[serde(borrow)]
    object: Option<&'a RawValue>,
    #[serde(borrow)]
    old_object: Option<&'a RawValue>,
    dry_run: Option<bool>,
}

#[derive(Deserialize)]
struct WireGvk {
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    kind: String,
}

#[derive(Deserialize, Default)]
struct WireUserInfo {
    #[serde(default)]
    username: String,
}

const DEFAULT_API_VERSION: &str = "admission.k8s.io/v1";

#[derive(Deserialize)]
struct FastReview {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<FastRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FastRequest {
    uid: Option<String>,
    kind: Option<WireGvk>,
    operation: Option<String>,
    sub_resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    #[serde(default)]
    user_info: WireUserInfo,
    object: Option<JobView>,
    old_object: Option<JobView>,
    dry_run: Option<bool>,
}

/// Reads an AdmissionReview body. Never panics; every failure says what was wrong in one line.
///
/// A well-formed review is read in one pass over the body; only a body that fails it is read
/// again, step by step, to name the problem (and the uid, when it can be found).
pub fn parse(body: &[u8]) -> Result<Review, BadReview> {
    let Ok(FastReview {
        api_version,
        kind,
        request: Some(req),
    }) = serde_json::from_slice::<FastReview>(body)
    else {
        return parse_slow(body);
    };
    let Some(uid) = req.uid.filter(|u| !u.is_empty()) else {
        return parse_slow(body);
    };
    let echo = EnvelopeEcho {
        api_version: api_version
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_API_VERSION.into()),
        kind: kind
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| "AdmissionReview".into()),
        uid,
    };
    check_request(
        echo,
        CheckedParts {
            kind: req.kind,
            operation: req.operation,
            sub_resource: req.sub_resource,
            namespace: req.namespace,
            name: req.name,
            username: req.user_info.username,
            dry_run: req.dry_run,
            object: req.object,
            old_object: req.old_object,
        },
    )
}

/// A request's parts once parsed, before the semantic checks.
struct CheckedParts {
    kind: Option<WireGvk>,
    operation: Option<String>,
    sub_resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    username: String,
    dry_run: Option<bool>,
    object: Option<JobView>,
    old_object: Option<JobView>,
}

fn check_request(echo: EnvelopeEcho, req: CheckedParts) -> Result<Review, BadReview> {
    let reject = |message: String| BadReview::Rejected {
        envelope: echo.clone(),
        message,
    };
    match &req.kind {
        Some(k) if k.group == "batch" && k.version == "v1" && k.kind == "Job" => {}
        Some(k) => {
            return Err(reject(format!(
                "this webhook reviews batch/v1 Jobs, not {}/{} {}; check the webhook configuration's rules",
                if k.group.is_empty() { "core" } else { &k.group },
                k.version,
                k.kind
            )))
        }
        None => return Err(reject("request.kind is missing".into())),
    }
    let op_text = req.operation.as_deref().unwrap_or_default();
    let operation = Operation::parse(op_text).ok_or_else(|| {
        reject(format!(
            "request.operation {op_text:?} is not one of CREATE, UPDATE, DELETE, CONNECT"
        ))
    })?;
    if let Some(kind) = req.object.as_ref().and_then(|o| o.kind.as_deref()) {
        if kind != "Job" {
            return Err(reject(format!(
                "request.object is a {kind}, not a batch/v1 Job"
            )));
        }
    }
    match operation {
        Operation::Create | Operation::Update if req.object.is_none() => {
            return Err(reject(format!(
                "request.object is missing from a {} review",
                operation.as_str()
            )))
        }
        Operation::Update if req.old_object.is_none() => {
            return Err(reject(
                "request.oldObject is missing from an UPDATE review".into(),
            ))
        }
        _ => {}
    }
    Ok(Review {
        envelope: echo.into(),
        operation,
        sub_resource: req.sub_resource.filter(|s| !s.is_empty()),
        namespace: req.namespace.filter(|s| !s.is_empty()),
        name: req.name.filter(|s| !s.is_empty()),
        username: req.username,
        dry_run: req.dry_run.unwrap_or(false),
        object: req.object,
        old_object: req.old_object,
    })
}

/// The careful path: reads the review step by step to say exactly what is wrong with it.
fn parse_slow(body: &[u8]) -> Result<Review, BadReview> {
    let wire: WireReview = serde_json::from_slice(body)
        .map_err(|e| BadReview::Unreadable(format!("body is not a JSON AdmissionReview: {e}")))?;
    let request = wire.request.ok_or_else(|| {
        BadReview::Unreadable("AdmissionReview has no request: nothing to review".into())
    })?;
    let uid = serde_json::from_str::<WireUid>(request.get())
        .map_err(|e| BadReview::Unreadable(format!("request is not an object: {e}")))?
        .uid
        .filter(|u| !u.is_empty())
        .ok_or_else(|| BadReview::Unreadable("request.uid is missing or empty".into()))?;
    let echo = EnvelopeEcho {
        api_version: wire
            .api_version
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_API_VERSION.into()),
        kind: wire
            .kind
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| "AdmissionReview".into()),
        uid,
    };
    let reject = |message: String| BadReview::Rejected {
        envelope: echo.clone(),
        message,
    };
    let req: WireRequest = serde_json::from_str(request.get())
        .map_err(|e| reject(format!("request could not be read: {e}")))?;
    let read_job = |raw: Option<&RawValue>, field: &str| -> Result<Option<JobView>, BadReview> {
        raw.map(|r| {
            serde_json::from_str::<JobView>(r.get())
                .map_err(|e| reject(format!("request.{field} is not a batch/v1 Job: {e}")))
        })
        .transpose()
    };
    let object = read_job(req.object, "object")?;
    let old_object = read_job(req.old_object, "oldObject")?;
    check_request(
        echo,
        CheckedParts {
            kind: req.kind,
            operation: req.operation,
            sub_resource: req.sub_resource,
            namespace: req.namespace,
            name: req.name,
            username: req.user_info.username,
            dry_run: req.dry_run,
            object,
            old_object,
        },
    )
}

impl Review {
    /// The namespace whose labels [`decide`] needs, if any: only a mutating CREATE of an
    /// unlabelled Job while a default queue is configured.
    pub fn namespace_to_look_up(&self, hook: Hook, policy: &AdmissionPolicy) -> Option<&str> {
        let wants = hook == Hook::Mutate
            && self.operation == Operation::Create
            && policy.default_queue.is_some()
            && policy.managed_namespaces.is_some()
            && self.object.as_ref().is_some_and(|o| o.queue().is_none());
        if wants {
            self.namespace
                .as_deref()
                .or_else(|| self.object.as_ref()?.metadata.namespace.as_deref())
        } else {
            None
        }
    }

    /// The object's name for logs: `generateName` creates have none yet.
    pub fn object_name(&self) -> &str {
        self.name
            .as_deref()
            .or_else(|| {
                let m = &self.object.as_ref()?.metadata;
                m.name.as_deref().or(m.generate_name.as_deref())
            })
            .unwrap_or("")
    }
}

/// A denial's HTTP-like status, as metav1.Status carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Denial {
    pub fn invalid(message: String) -> Self {
        Self {
            code: 422,
            reason: "Invalid",
            message,
        }
    }
    pub fn forbidden(message: String) -> Self {
        Self {
            code: 403,
            reason: "Forbidden",
            message,
        }
    }
    pub fn bad_request(message: String) -> Self {
        Self {
            code: 400,
            reason: "BadRequest",
            message,
        }
    }
    pub fn unavailable(message: String) -> Self {
        Self {
            code: 503,
            reason: "ServiceUnavailable",
            message,
        }
    }
}

/// What the webhook answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub denial: Option<Denial>,
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
}

impl Decision {
    pub fn allow() -> Self {
        Self::default()
    }
    pub fn deny(denial: Denial) -> Self {
        Self {
            denial: Some(denial),
            ..Self::default()
        }
    }
    pub fn allowed(&self) -> bool {
        self.denial.is_none()
    }
    pub fn mutated(&self) -> bool {
        self.allowed() && !self.patch.0.is_empty()
    }
    /// The short label used in metrics and logs.
    pub fn outcome(&self) -> &'static str {
        if !self.allowed() {
            "denied"
        } else if self.mutated() {
            "patched"
        } else {
            "allowed"
        }
    }
}

/// The pure admission decision for a parsed review.
///
/// `namespace_labels` are the labels of the namespace [`Review::namespace_to_look_up`] named
/// (`None` when it was not asked for or the Namespace does not exist).
pub fn decide(
    hook: Hook,
    review: &Review,
    policy: &AdmissionPolicy,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Decision {
    match (hook, review.operation) {
        (Hook::Mutate, Operation::Create) => match &review.object {
            Some(job) => {
                let gets_default_queue = job.queue().is_none()
                    && match (&policy.managed_namespaces, namespace_labels) {
                        (Some(sel), Some(labels)) => selector::matches(sel, labels),
                        _ => false,
                    };
                let default_queue = policy
                    .default_queue
                    .as_deref()
                    .filter(|_| gets_default_queue);
                job::mutate(job, default_queue)
            }
            None => Decision::allow(),
        },
        (Hook::Validate, Operation::Create | Operation::Update) => match &review.object {
            Some(job) => job::validate(
                review.operation,
                review.sub_resource.as_deref(),
                job,
                review.old_object.as_ref(),
                &review.username,
                policy,
            ),
            None => Decision::allow(),
        },
        // DELETE and CONNECT are never gated, and the mutating hook only acts at creation.
        _ => Decision::allow(),
    }
}

#[derive(Serialize)]
struct WireReply<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    response: WireResponse<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<WireStatus<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

#[derive(Serialize)]
struct WireStatus<'a> {
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

/// The AdmissionReview reply for `decision`. `patchType` appears only with a patch.
pub fn render(envelope: &Envelope, decision: &Decision) -> Vec<u8> {
    let patch = decision.mutated().then(|| {
        // Serialising a Patch of plain JSON values cannot fail.
        let json = serde_json::to_vec(&decision.patch).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(json)
    });
    let reply = WireReply {
        api_version: &envelope.api_version,
        kind: &envelope.kind,
        response: WireResponse {
            uid: &envelope.uid,
            allowed: decision.allowed(),
            status: decision.denial.as_ref().map(|d| WireStatus {
                status: "Failure",
                message: &d.message,
                reason: d.reason,
                code: d.code,
            }),
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: &decision.warnings,
        },
    };
    serde_json::to_vec(&reply).unwrap_or_default()
}

/// Convenience for the common path: a body in, the reply body and decision out, given the
/// Namespace labels the caller already resolved. Used by benchmarks and fuzz tests.
pub fn review_body(
    hook: Hook,
    body: &[u8],
    policy: &AdmissionPolicy,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<(Vec<u8>, Decision), BadReview> {
    match parse(body) {
        Ok(review) => {
            let d = decide(hook, &review, policy, namespace_labels);
            Ok((render(&review.envelope, &d), d))
        }
        Err(BadReview::Rejected { envelope, message }) => {
            let d = Decision::deny(Denial::bad_request(message));
            Ok((render(&envelope.into(), &d), d))
        }
        Err(e) => Err(e),
    }
}

/// The queue a Job belongs to, from its labels.
pub fn queue_of(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
    labels?.get(QUEUE_LABEL).map(String::as_str)
}
