//! What carrying out an action did to what the dispatcher knows. Every executor (live,
//! `simulate`, the tests) reports each action's outcome here, so that they cannot drift
//! apart in what they assume.

use super::action::{job_after, job_claimed, Action};
use super::state::RefusedWrite;
use super::world::World;
use std::time::SystemTime;

/// What became of an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The executor starts carrying it out: a dispatch's placement is held and a copy's
    /// create noted before any write, so that the next plan sees them whatever becomes of
    /// the writes (a failed create leaves the Job unclaimed, and the reconciler then lets
    /// the placement go).
    Started,
    /// Done: the manager Job is as the action says, a copy deleted is gone.
    Done,
    /// Of a dispatch or an offer, only the claim was written: a copy could not be created
    /// (see [`job_claimed`]).
    Claimed,
    /// The live executor goes on as if it were done while its writes are in flight (the
    /// API server's answer replaces the Job when it lands): all of it but giving quota
    /// back, which waits for the write that gives it back (assumed, and the write failed,
    /// the Job would hold it again after another Job took it).
    Assumed,
    /// It failed (an error, a timeout, an unreachable worker): the Job is looked at again.
    Failed,
    /// The API server refused the status write for good: it is not tried again until the
    /// copy's status changes.
    StatusRefused,
    /// The manager's API server refused the write for good while the Job was at this
    /// resourceVersion: not tried again until the Job changes.
    Refused { resource_version: String },
    /// Decided, not carried out (refused for good before, or its Job's writes are in
    /// flight): the room the pass placed a dispatch's pods on was never taken, and the
    /// misfits the same pass found there did not count it.
    NotCarriedOut,
}

/// Applies `outcome` of `action` to the world.
pub(crate) fn apply(world: &mut World, action: &Action, outcome: Outcome, now: SystemTime) {
    match outcome {
        Outcome::Started => started(world, action, now),
        Outcome::Done => done(world, action, now, true),
        Outcome::Assumed => done(world, action, now, false),
        Outcome::Claimed => {
            let claimed = action
                .job()
                .and_then(|k| world.state.jobs.get(k))
                .and_then(|j| job_claimed(j, action));
            if let Some(j) = claimed {
                world.upsert_job(j);
            }
        }
        Outcome::Failed => {
            if let Some(key) = job_of(world, action) {
                world.touch(&key);
            }
        }
        Outcome::StatusRefused => {
            if let Action::WriteStatus { job, digest, .. } = action {
                if let Some(uid) = world.state.jobs.get(job).map(|j| j.uid.clone()) {
                    world.state.writes.refused_status.insert(uid, *digest);
                }
                world.touch(job);
            }
        }
        Outcome::Refused { resource_version } => {
            if let Some(key) = action.job() {
                if let Some(uid) = world.state.jobs.get(key).map(|j| j.uid.clone()) {
                    let refused = RefusedWrite {
                        resource_version,
                        action: action.name(),
                    };
                    world.state.writes.refused_writes.insert(uid, refused);
                }
            }
        }
        Outcome::NotCarriedOut => {
            if let Action::Dispatch { cluster, hold, .. } = action {
                for t in &hold.takes {
                    world.node_gained_room(cluster, t.index);
                }
            }
        }
    }
}

fn started(world: &mut World, action: &Action, now: SystemTime) {
    let creates = match action {
        Action::Dispatch { hold, .. } => {
            if !hold.takes.is_empty() {
                world.hold(hold.clone());
            }
            true
        }
        Action::CreateCopy { .. } | Action::Offer { .. } => true,
        _ => false,
    };
    if creates {
        let uid = action
            .job()
            .and_then(|k| world.state.jobs.get(k))
            .map(|j| j.uid.clone());
        if let Some(uid) = uid {
            world.state.writes.create_attempted.insert(uid, now);
        }
    }
}

fn done(world: &mut World, action: &Action, now: SystemTime, gives_back: bool) {
    match action {
        _ if !gives_back => {}
        Action::Hold(h) => world.hold(h.clone()),
        Action::Release { job_uid } => world.release(job_uid),
        Action::DeleteCopy {
            cluster,
            uid,
            origin_uid,
            ..
        } => world.forget_copy(cluster, origin_uid, uid),
        _ => {}
    }
    let Some(job) = action.job().and_then(|k| world.state.jobs.get(k)) else {
        return;
    };
    if let Some(new) = job_after(job, action, now) {
        if gives_back || !job.holds_quota() || new.holds_quota() {
            world.upsert_job(new);
        }
    }
}

/// The manager Job an action is about (a copy's, for a copy's removal).
fn job_of(world: &World, action: &Action) -> Option<super::JobKey> {
    match action {
        Action::DeleteCopy { origin_uid, .. } => {
            world.state.job_by_uid(origin_uid).map(|j| j.key.clone())
        }
        other => other.job().cloned(),
    }
}
