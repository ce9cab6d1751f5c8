//! admission.k8s.io/v1 AdmissionReview handling for the kinds the dispatcher runs (batch/v1
//! Jobs and JobSets: the same rules, on `spec.suspend`, `spec.managedBy` and the queue label,
//! which both kinds have at the same paths).
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

pub use crate::dispatcher::kind::Kind;
pub(crate) use job::JobView;

use crate::selector;
use crate::wellknown::DEFAULT_DISPATCHER_USERNAME;
use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Which of the two webhooks a review was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Mutate,
    Validate,
}

impl Hook {
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) enum Operation {
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

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
        }
    }
}

/// A review whose request could be read; decisions are made on this. Its text borrows from
/// the body wherever the JSON string had no escapes.
#[derive(Debug)]
pub(crate) struct Review<'a> {
    pub(crate) envelope: Envelope<'a>,
    /// The kind reviewed (the one the webhook's path is for).
    pub(crate) kind: Kind,
    pub(crate) operation: Operation,
    pub(crate) sub_resource: Option<Cow<'a, str>>,
    pub(crate) namespace: Option<Cow<'a, str>>,
    pub(crate) name: Option<Cow<'a, str>>,
    pub(crate) username: Cow<'a, str>,
    pub(crate) dry_run: bool,
    pub(crate) object: Option<JobView<'a>>,
    pub(crate) old_object: Option<JobView<'a>>,
}

/// What every reply echoes: the review's `apiVersion`, `kind` and `request.uid`.
#[derive(Debug, Clone)]
pub(crate) struct Envelope<'a> {
    pub(crate) api_version: Cow<'a, str>,
    pub(crate) kind: Cow<'a, str>,
    pub(crate) uid: Cow<'a, str>,
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
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) uid: String,
}

impl From<EnvelopeEcho> for Envelope<'static> {
    fn from(e: EnvelopeEcho) -> Self {
        Envelope {
            api_version: e.api_version.into(),
            kind: e.kind.into(),
            uid: e.uid.into(),
        }
    }
}

impl Envelope<'_> {
    fn echo(&self) -> EnvelopeEcho {
        EnvelopeEcho {
            api_version: self.api_version.clone().into_owned(),
            kind: self.kind.clone().into_owned(),
            uid: self.uid.clone().into_owned(),
        }
    }
}

/// A JSON string, borrowed from the body when it has no escapes and copied when it has.
/// (serde borrows a bare `Cow<str>` field but never one inside an `Option`.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Text<'a>(pub Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> serde::de::Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                // As String's, so errors read the same as they did with owned strings.
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_string(TextVisitor)
    }
}

/// A present, non-empty string.
fn non_empty(t: Option<Text<'_>>) -> Option<Cow<'_, str>> {
    t.map(|t| t.0).filter(|s| !s.is_empty())
}

#[derive(Deserialize)]
struct WireReview<'a> {
    #[serde(rename = "apiVersion", borrow)]
    api_version: Option<Text<'a>>,
    #[serde(borrow)]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    request: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireUid<'a> {
    #[serde(borrow)]
    uid: Option<Text<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest<'a> {
    #[serde(borrow)]
    kind: Option<WireGvk<'a>>,
    #[serde(borrow)]
    operation: Option<Text<'a>>,
    #[serde(borrow)]
    sub_resource: Option<Text<'a>>,
    #[serde(borrow)]
    namespace: Option<Text<'a>>,
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    user_info: WireUserInfo<'a>,
    #[serde(borrow)]
    object: Option<&'a RawValue>,
    #[serde(borrow)]
    old_object: Option<&'a RawValue>,
    dry_run: Option<bool>,
}

#[derive(Deserialize)]
struct WireGvk<'a> {
    #[serde(default, borrow)]
    group: Text<'a>,
    #[serde(default, borrow)]
    version: Text<'a>,
    #[serde(default, borrow)]
    kind: Text<'a>,
}

#[derive(Deserialize, Default)]
struct WireUserInfo<'a> {
    #[serde(default, borrow)]
    username: Text<'a>,
}

const DEFAULT_API_VERSION: &str = "admission.k8s.io/v1";
const DEFAULT_KIND: &str = "AdmissionReview";

#[derive(Deserialize)]
struct FastReview<'a> {
    #[serde(rename = "apiVersion", borrow)]
    api_version: Option<Text<'a>>,
    #[serde(borrow)]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    request: Option<FastRequest<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FastRequest<'a> {
    #[serde(borrow)]
    uid: Option<Text<'a>>,
    #[serde(borrow)]
    kind: Option<WireGvk<'a>>,
    #[serde(borrow)]
    operation: Option<Text<'a>>,
    #[serde(borrow)]
    sub_resource: Option<Text<'a>>,
    #[serde(borrow)]
    namespace: Option<Text<'a>>,
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    user_info: WireUserInfo<'a>,
    #[serde(default, borrow, deserialize_with = "job::object")]
    object: Option<JobView<'a>>,
    #[serde(default, borrow, deserialize_with = "job::object")]
    old_object: Option<JobView<'a>>,
    dry_run: Option<bool>,
}

fn envelope<'a>(
    api_version: Option<Text<'a>>,
    kind: Option<Text<'a>>,
    uid: Cow<'a, str>,
) -> Envelope<'a> {
    Envelope {
        api_version: non_empty(api_version).unwrap_or(Cow::Borrowed(DEFAULT_API_VERSION)),
        kind: non_empty(kind).unwrap_or(Cow::Borrowed(DEFAULT_KIND)),
        uid,
    }
}

/// Reads an AdmissionReview body. Never panics; every failure says what was wrong in one line.
///
/// A well-formed review is read in one pass over the body; only a body that fails it is read
/// again, step by step, to name the problem (and the uid, when it can be found). `reviewed`:
/// the kind the webhook reviews (its path says which); a review of another is refused.
pub(crate) fn parse(body: &[u8], reviewed: Kind) -> Result<Review<'_>, BadReview> {
    // Checking the body's UTF-8 once is cheaper than serde_json checking each string it
    // keeps; a body that is not UTF-8 is read from bytes, exactly as before.
    let fast = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str::<FastReview>(text),
        Err(_) => serde_json::from_slice::<FastReview>(body),
    };
    let Ok(FastReview {
        api_version,
        kind,
        request: Some(req),
    }) = fast
    else {
        return parse_slow(body, reviewed);
    };
    let Some(uid) = non_empty(req.uid) else {
        return parse_slow(body, reviewed);
    };
    check_request(
        envelope(api_version, kind, uid),
        reviewed,
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
struct CheckedParts<'a> {
    kind: Option<WireGvk<'a>>,
    operation: Option<Text<'a>>,
    sub_resource: Option<Text<'a>>,
    namespace: Option<Text<'a>>,
    name: Option<Text<'a>>,
    username: Text<'a>,
    dry_run: Option<bool>,
    object: Option<JobView<'a>>,
    old_object: Option<JobView<'a>>,
}

fn check_request<'a>(
    envelope: Envelope<'a>,
    reviewed: Kind,
    req: CheckedParts<'a>,
) -> Result<Review<'a>, BadReview> {
    let reject = |message: String| BadReview::Rejected {
        envelope: envelope.echo(),
        message,
    };
    match &req.kind {
        Some(k)
            if *k.group == *reviewed.group()
                && *k.version == *reviewed.version()
                && *k.kind == *reviewed.name() => {}
        Some(k) => {
            return Err(reject(format!(
            "this webhook reviews {} {}s, not {}/{} {}; check the webhook configuration's rules",
            reviewed.api_version(),
            reviewed.name(),
            if k.group.is_empty() { "core" } else { &k.group },
            &*k.version,
            &*k.kind
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
    for (field, object) in [("object", &req.object), ("oldObject", &req.old_object)] {
        if let Some(kind) = object.as_ref().and_then(|o| o.kind.as_deref()) {
            if kind != reviewed.name() {
                return Err(reject(format!(
                    "request.{field} is a {kind}, not a {} {}",
                    reviewed.api_version(),
                    reviewed.name()
                )));
            }
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
        envelope,
        kind: reviewed,
        operation,
        sub_resource: non_empty(req.sub_resource),
        namespace: non_empty(req.namespace),
        name: non_empty(req.name),
        username: req.username.0,
        dry_run: req.dry_run.unwrap_or(false),
        object: req.object,
        old_object: req.old_object,
    })
}

/// The careful path: reads the review step by step to say exactly what is wrong with it.
fn parse_slow<'a>(body: &'a [u8], reviewed: Kind) -> Result<Review<'a>, BadReview> {
    let wire: WireReview = serde_json::from_slice(body)
        .map_err(|e| BadReview::Unreadable(format!("body is not a JSON AdmissionReview: {e}")))?;
    let request = wire.request.ok_or_else(|| {
        BadReview::Unreadable("AdmissionReview has no request: nothing to review".into())
    })?;
    let uid = serde_json::from_str::<WireUid>(request.get())
        .map_err(|e| BadReview::Unreadable(format!("request is not an object: {e}")))?
        .uid;
    let uid = non_empty(uid)
        .ok_or_else(|| BadReview::Unreadable("request.uid is missing or empty".into()))?;
    let envelope = envelope(wire.api_version, wire.kind, uid);
    let reject = |message: String| BadReview::Rejected {
        envelope: envelope.echo(),
        message,
    };
    let req: WireRequest = serde_json::from_str(request.get())
        .map_err(|e| reject(format!("request could not be read: {e}")))?;
    let read_job = |raw: Option<&'a RawValue>, field: &str| -> Result<Option<JobView<'a>>, _> {
        let Some(raw) = raw else { return Ok(None) };
        job::object(&mut serde_json::Deserializer::from_str(raw.get())).map_err(|e| {
            reject(format!(
                "request.{field} is not a {} {}: {e}",
                reviewed.api_version(),
                reviewed.name()
            ))
        })
    };
    let object = read_job(req.object, "object")?;
    let old_object = read_job(req.old_object, "oldObject")?;
    check_request(
        envelope,
        reviewed,
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

impl Review<'_> {
    /// The namespace whose labels [`decide`] needs, if any: only a mutating CREATE of an
    /// unlabelled Job while a default queue is configured.
    pub(crate) fn namespace_to_look_up(
        &self,
        hook: Hook,
        policy: &AdmissionPolicy,
    ) -> Option<&str> {
        let wants = hook == Hook::Mutate
            && self.operation == Operation::Create
            && policy.default_queue.is_some()
            && policy.managed_namespaces.is_some()
            && self.object.as_ref().is_some_and(|o| o.queue().is_none());
        if wants {
            self.namespace.as_deref().or_else(|| {
                self.object
                    .as_ref()?
                    .metadata
                    .as_ref()?
                    .namespace
                    .as_deref()
            })
        } else {
            None
        }
    }

    /// The object's name for logs: `generateName` creates have none yet.
    pub(crate) fn object_name(&self) -> &str {
        self.name
            .as_deref()
            .or_else(|| {
                let m = self.object.as_ref()?.metadata.as_ref()?;
                m.name.as_deref().or(m.generate_name.as_deref())
            })
            .unwrap_or("")
    }
}

/// A denial's HTTP-like status, as metav1.Status carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Denial {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl Denial {
    /// A denial's message is cut to [`crate::text::REQUEST_MESSAGE_BYTES`]: one may quote a
    /// value from the request, which the API server's own checks keep short but anyone else
    /// may make a megabyte.
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        let message = match message.len() > crate::text::REQUEST_MESSAGE_BYTES {
            true => crate::text::about_request(&message),
            false => message,
        };
        Self {
            code,
            reason,
            message,
        }
    }
    pub(crate) fn invalid(message: String) -> Self {
        Self::new(422, "Invalid", message)
    }
    pub(crate) fn forbidden(message: String) -> Self {
        Self::new(403, "Forbidden", message)
    }
    pub(crate) fn bad_request(message: String) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub(crate) fn unavailable(message: String) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }
}

/// What the webhook answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    pub(crate) denial: Option<Denial>,
    pub patch: json_patch::Patch,
    pub(crate) warnings: Vec<String>,
}

impl Decision {
    pub(crate) fn allow() -> Self {
        Self::default()
    }
    pub(crate) fn deny(denial: Denial) -> Self {
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
pub(crate) fn decide(
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
                job::mutate(review.kind, job, default_queue)
            }
            None => Decision::allow(),
        },
        (Hook::Validate, Operation::Create | Operation::Update) => match &review.object {
            Some(job) => job::validate(
                review.kind,
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
pub(crate) fn render(envelope: &Envelope, decision: &Decision) -> Vec<u8> {
    let patch = decision.mutated().then(|| {
        let mut json = Vec::with_capacity(256);
        // Serialising a Patch of plain JSON values into memory cannot fail.
        let _ = serde_json::to_writer(&mut json, &decision.patch);
        base64::engine::general_purpose::STANDARD.encode(json)
    });
    // Sized once: the fixed part of a reply is under 200 bytes, the rest is its texts.
    let capacity = 200
        + envelope.api_version.len()
        + envelope.kind.len()
        + envelope.uid.len()
        + patch.as_ref().map_or(0, String::len)
        + decision.denial.as_ref().map_or(0, |d| d.message.len())
        + decision.warnings.iter().map(|w| w.len() + 3).sum::<usize>();
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
    let mut out = Vec::with_capacity(capacity);
    // Plain strings, numbers and booleans into memory: cannot fail.
    let _ = serde_json::to_writer(&mut out, &reply);
    out
}

/// Convenience for the common path: a batch/v1 Job review's body in, the reply body and
/// decision out, given the Namespace labels the caller already resolved. Used by benchmarks
/// and fuzz tests.
pub fn review_body(
    hook: Hook,
    body: &[u8],
    policy: &AdmissionPolicy,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<(Vec<u8>, Decision), BadReview> {
    review_body_of(Kind::Job, hook, body, policy, namespace_labels)
}

/// [`review_body`] for a review sent to `kind`'s hook.
pub fn review_body_of(
    kind: Kind,
    hook: Hook,
    body: &[u8],
    policy: &AdmissionPolicy,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<(Vec<u8>, Decision), BadReview> {
    match parse(body, kind) {
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
