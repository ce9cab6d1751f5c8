//! The rules kube-apiserver (1.36) holds a batch/v1 Job's status to on a status write, for a
//! Job with `spec.managedBy` (`pkg/registry/batch/job` status strategy), written here again
//! from the rules as documented at the top of src/dispatcher/mirror.rs, over plain JSON: the
//! fake API server refuses what breaks them, so a test sees a status the real server would
//! refuse, whatever code in the crate computed it.

use serde_json::Value;

fn is_true(status: &Value, type_: &str) -> bool {
    status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    })
}

fn count(status: &Value, field: &str) -> i64 {
    status[field].as_i64().unwrap_or(0)
}

fn time(status: &Value, field: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    status[field].as_str().and_then(|t| t.parse().ok())
}

/// The rule `new` breaks when written over `old` (the Job's `spec.suspend` being `suspended`
/// after the write), in the API server's words; `None` when it may be written.
pub fn violation(old: &Value, new: &Value, suspended: bool) -> Option<String> {
    let complete = is_true(new, "Complete");
    let failed = is_true(new, "Failed");
    let success_met = is_true(new, "SuccessCriteriaMet");
    let failure_target = is_true(new, "FailureTarget");
    let finished = complete || failed;
    let checks: [(bool, &str); 21] = [
        (
            new["ready"].is_i64() && count(new, "ready") > count(new, "active"),
            "status.ready: cannot set more ready pods than active",
        ),
        (
            complete && failed,
            "status.conditions: cannot set Complete=True and Failed=true conditions",
        ),
        (
            complete && failure_target,
            "status.conditions: cannot set Complete=True and FailureTarget=true conditions",
        ),
        (
            success_met && failed,
            "status.conditions: cannot set SuccessCriteriaMet=True and Failed=true conditions",
        ),
        (
            success_met && failure_target,
            "status.conditions: cannot set SuccessCriteriaMet=True and FailureTarget=true conditions",
        ),
        (
            complete && !success_met,
            "status.conditions: cannot set Complete=True condition without the SuccessCriteriaMet=true condition",
        ),
        (
            failed && !failure_target,
            "status.conditions: cannot set Failed=True condition without the FailureTarget=true condition",
        ),
        (
            complete && new["completionTime"].is_null(),
            "status.completionTime: Required value: completionTime is required for Complete jobs",
        ),
        (
            !complete && !new["completionTime"].is_null(),
            "status.completionTime: cannot set completionTime when there is no Complete=True condition",
        ),
        (
            finished && count(new, "active") > 0,
            "status.active: active>0 is invalid for finished job",
        ),
        (
            finished && new["startTime"].is_null(),
            "status.startTime: Required value: startTime is required for finished job",
        ),
        (
            finished && count(new, "terminating") > 0,
            "status.terminating: terminating>0 is invalid for finished job",
        ),
        (
            finished
                && ["succeeded", "failed"].iter().any(|k| {
                    new["uncountedTerminatedPods"][k]
                        .as_array()
                        .is_some_and(|v| !v.is_empty())
                }),
            "status.uncountedTerminatedPods: uncountedTerminatedPods needs to be empty for finished job",
        ),
        (
            matches!((time(new, "startTime"), time(new, "completionTime")), (Some(s), Some(c)) if c < s),
            "status.completionTime: must be equal to or after startTime",
        ),
        (
            matches!((time(old, "completionTime"), time(new, "completionTime")), (Some(o), Some(n)) if o != n),
            "status.completionTime: completionTime cannot be mutated",
        ),
        (
            !suspended
                && time(old, "startTime").is_some()
                && time(old, "startTime") != time(new, "startTime"),
            "status.startTime: field is immutable for unsuspended job once set",
        ),
        (
            is_true(old, "Complete") && !complete,
            "status.conditions: cannot disable the terminal Complete=True condition",
        ),
        (
            is_true(old, "Failed") && !failed,
            "status.conditions: cannot disable the terminal Failed=True condition",
        ),
        (
            is_true(old, "FailureTarget") && !failure_target,
            "status.conditions: cannot disable the terminal FailureTarget=True condition",
        ),
        (
            is_true(old, "SuccessCriteriaMet") && !success_met,
            "status.conditions: cannot disable the SuccessCriteriaMet=True condition",
        ),
        (
            count(new, "succeeded") < count(old, "succeeded")
                || count(new, "failed") < count(old, "failed"),
            "status.succeeded, status.failed: cannot decrease the counters",
        ),
    ];
    checks
        .iter()
        .find(|(broken, _)| *broken)
        .map(|(_, rule)| rule.to_string())
}
