//! Switchyard against real Kubernetes: kube-apiserver, etcd, kube-controller-manager and
//! kube-scheduler started on loopback by the harness in tests/common/k8s (envtest's idea),
//! with Switchyard driven through its binary and CLI only.
//!
//! The binaries come from `SWITCHYARD_K8S_ASSETS` (or `KUBEBUILDER_ASSETS`, as setup-envtest
//! fills it, for the scenarios that need only kube-apiserver and etcd). Without them this test
//! says so in one line and passes; with `SWITCHYARD_REQUIRE_K8S=1` it fails instead. The
//! scenarios that install the chart's RBAC need Helm as tests/chart.rs finds it. The JobSet
//! scenarios (in a control plane of their own, and through the fleet) need `jobset-controller`
//! beside them (or `SWITCHYARD_JOBSET_CONTROLLER`), and are skipped with one line without it.
//! The Kueue scenarios (a third worker running the Kueue controller manager) need
//! `kueue-controller` (or `SWITCHYARD_KUEUE_CONTROLLER`) and openssl, likewise.
//!
//! One fleet (see `env`) is shared by every scenario, each in namespaces and queues of its own;
//! the scenarios run concurrently, except that one killing a replica has the fleet to itself and
//! those partitioning worker w2 keep off it every other scenario that needs w2 to answer. A
//! failure keeps the logs of every process and says where.

#[path = "../common/k8s/mod.rs"]
mod k8s;

mod admission;
mod api;
mod dispatch;
mod env;
mod extender;
mod helm;
mod jobset;
mod jobset_dispatch;
mod kueue_dispatch;

use env::Env;
use futures::FutureExt;
use k8s::assets::{Assets, REQUIRE_ENV};
use libtest_mimic::{Arguments, Failed, Trial};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::sync::Arc;

/// What a scenario needs of the suite.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// An API server (kube-apiserver and etcd).
    Api,
    /// The whole fleet: controller managers, schedulers and Helm too.
    Fleet,
    /// A control plane of its own with a controller manager, a scheduler, fake-kubelet nodes
    /// and the JobSet controller.
    JobSet,
    /// The whole fleet and the JobSet controller in each of its clusters.
    FleetJobSet,
    /// The whole fleet and a third worker running the Kueue controller manager.
    FleetKueue,
}

pub struct Suite {
    runtime: tokio::runtime::Runtime,
    assets: Assets,
    dir: tempfile::TempDir,
    fleet: tokio::sync::Mutex<Option<Result<Arc<Env>, String>>>,
    api: tokio::sync::Mutex<Option<Result<Arc<k8s::ControlPlane>, String>>>,
    jobset: tokio::sync::Mutex<Option<Result<Arc<jobset::JobSetPlane>, String>>>,
    /// Whether the fleet can be started (else the API-only scenarios get a plane of their own).
    fleet_possible: bool,
    failed: std::sync::atomic::AtomicBool,
}

pub(crate) fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

impl Suite {
    /// The shared fleet, started by the first scenario that asks for it.
    pub async fn fleet(&self) -> Arc<Env> {
        let mut slot = self.fleet.lock().await;
        if slot.is_none() {
            let dir = self.dir.path().join("fleet");
            let started = AssertUnwindSafe(Env::start(&self.assets, &dir))
                .catch_unwind()
                .await
                .unwrap_or_else(|p| Err(panic_text(p)));
            *slot = Some(started.map(Arc::new));
        }
        match slot.as_ref().expect("set above") {
            Ok(env) => env.clone(),
            Err(e) => panic!("the fleet did not start: {e}"),
        }
    }

    /// A control plane for scenarios that need an API server only: the fleet's manager when
    /// there is a fleet, else one of its own.
    pub async fn api_server(&self) -> ApiServer {
        if self.fleet_possible {
            return ApiServer::Fleet(self.fleet().await);
        }
        let mut slot = self.api.lock().await;
        if slot.is_none() {
            let options = k8s::Options {
                name: "api".into(),
                controller_manager: false,
                scheduler: false,
            };
            let started = AssertUnwindSafe(k8s::ControlPlane::start(
                &self.assets,
                &self.dir.path().join("api"),
                options,
            ))
            .catch_unwind()
            .await
            .unwrap_or_else(|p| Err(panic_text(p)));
            *slot = Some(started.map(Arc::new));
        }
        match slot.as_ref().expect("set above") {
            Ok(p) => ApiServer::Alone(p.clone()),
            Err(e) => panic!("the API server did not start: {e}"),
        }
    }
}

impl Suite {
    /// The control plane running the JobSet controller, started by the first scenario that
    /// asks for it.
    pub async fn jobset_plane(&self) -> Arc<jobset::JobSetPlane> {
        let mut slot = self.jobset.lock().await;
        if slot.is_none() {
            let dir = self.dir.path().join("jobset");
            let started = AssertUnwindSafe(jobset::JobSetPlane::start(&self.assets, &dir))
                .catch_unwind()
                .await
                .unwrap_or_else(|p| Err(panic_text(p)));
            *slot = Some(started.map(Arc::new));
        }
        match slot.as_ref().expect("set above") {
            Ok(p) => p.clone(),
            Err(e) => panic!("the JobSet control plane did not start: {e}"),
        }
    }
}

/// An API server to test against.
pub enum ApiServer {
    Fleet(Arc<Env>),
    Alone(Arc<k8s::ControlPlane>),
}

impl ApiServer {
    pub fn plane(&self) -> &k8s::ControlPlane {
        match self {
            ApiServer::Fleet(env) => &env.manager,
            ApiServer::Alone(p) => p,
        }
    }
}

type Scenario = fn(Arc<Suite>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

macro_rules! scenario {
    ($needs:expr, $f:path) => {
        (
            stringify!($f),
            $needs,
            (|s: Arc<Suite>| Box::pin($f(s)) as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>)
                as Scenario,
        )
    };
}

fn scenarios() -> Vec<(&'static str, Needs, Scenario)> {
    vec![
        scenario!(Needs::Api, api::crds_install_and_refuse_what_the_readme_says),
        scenario!(Needs::Fleet, api::chart_manifests_pass_a_server_side_dry_run),
        scenario!(Needs::Fleet, admission::unsuspending_as_another_user_is_denied_by_the_validating_webhook),
        scenario!(Needs::Fleet, dispatch::a_gpu_job_runs_in_the_worker_and_completes_in_the_manager),
        scenario!(Needs::Fleet, dispatch::a_job_that_fits_no_numa_zone_waits_with_the_reason_and_is_never_dispatched),
        scenario!(Needs::Fleet, dispatch::deleting_a_managers_job_deletes_its_copy),
        scenario!(Needs::Fleet, dispatch::a_workers_default_scheduler_puts_the_pods_where_the_dispatcher_placed_them),
        scenario!(Needs::Fleet, dispatch::a_job_whose_pods_keep_one_to_a_node_goes_only_where_there_are_nodes_enough),
        scenario!(Needs::Fleet, dispatch::a_job_whose_pods_spread_over_nodes_goes_only_where_its_spread_fits),
        scenario!(Needs::Fleet, dispatch::a_job_whose_pods_keep_together_goes_only_where_one_zone_holds_it),
        scenario!(Needs::Fleet, dispatch::a_partition_longer_than_worker_lost_timeout_requeues_then_heals_to_one_copy),
        scenario!(Needs::Fleet, dispatch::a_partition_shorter_than_worker_lost_timeout_requeues_nothing),
        scenario!(Needs::Fleet, dispatch::a_leader_killed_in_a_burst_of_200_jobs_is_replaced_and_every_job_completes_once),
        scenario!(Needs::Fleet, extender::numa_trap_stays_pending_with_the_extenders_reason_node_cache),
        scenario!(Needs::Fleet, extender::numa_trap_stays_pending_with_the_extenders_reason_no_node_cache),
        scenario!(Needs::Fleet, extender::gang_selecting_virtual_nodes_lands_on_the_only_cluster_that_holds_it_node_cache),
        scenario!(Needs::Fleet, extender::gang_selecting_virtual_nodes_lands_on_the_only_cluster_that_holds_it_no_node_cache),
        scenario!(Needs::JobSet, jobset::a_jobset_completes_and_one_managed_by_switchyard_is_left_alone),
        scenario!(Needs::FleetJobSet, jobset_dispatch::a_jobset_runs_in_a_worker_and_completes_in_the_manager),
        scenario!(Needs::FleetJobSet, jobset_dispatch::a_failing_jobset_is_failed_in_the_manager),
        scenario!(Needs::FleetJobSet, jobset_dispatch::a_lost_workers_jobset_is_requeued_and_completes_in_the_other_worker),
        scenario!(Needs::FleetKueue, kueue_dispatch::a_job_waits_in_the_workers_kueue_until_its_quota_has_room_then_completes),
        scenario!(Needs::FleetKueue, kueue_dispatch::a_copy_the_workers_kueue_never_admits_is_taken_back_and_runs_in_another_worker),
        scenario!(Needs::FleetKueue, kueue_dispatch::a_quota_raised_in_the_worker_is_seen_by_placement),
    ]
}

fn skip_or_fail(why: &str) -> ExitCode {
    if Assets::required() {
        eprintln!("realk8s: {why}, and {REQUIRE_ENV}=1");
        ExitCode::FAILURE
    } else {
        println!("realk8s: skipped: {why}");
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    k8s::reaper::run_if_reaper();
    let mut args = Arguments::from_args();
    let assets = match Assets::find() {
        Ok(a) => a,
        Err(why) => return skip_or_fail(&why),
    };
    // Scenarios mostly wait on the control planes: they all start together, not two at a
    // time (those that must wait for one another do so on the fleet's locks).
    if args.test_threads.is_none() {
        args.test_threads = Some(scenarios().len());
    }
    let mut missing: Vec<String> = assets
        .missing_for_full()
        .into_iter()
        .map(|m| format!("{m} is not in {}", assets.source))
        .collect();
    if let Err(why) = helm::available() {
        missing.push(why);
    }
    let fleet_possible = missing.is_empty();
    let all = scenarios();
    let mut jobset_missing: Vec<String> = assets
        .missing_for_full()
        .into_iter()
        .map(|m| format!("{m} is not in {}", assets.source))
        .collect();
    jobset_missing.extend(assets.missing_jobset_controller());
    let jobset_possible = jobset_missing.is_empty();
    if !jobset_possible {
        if Assets::required() {
            eprintln!(
                "realk8s: {}, and {REQUIRE_ENV}=1",
                jobset_missing.join("; ")
            );
            return ExitCode::FAILURE;
        }
        let skipped = all
            .iter()
            .filter(|(_, n, _)| matches!(n, Needs::JobSet | Needs::FleetJobSet))
            .count();
        println!(
            "realk8s: {skipped} JobSet scenario(s) skipped: {}",
            jobset_missing.join("; ")
        );
    }
    let mut kueue_missing: Vec<String> = assets.missing_kueue_controller().into_iter().collect();
    kueue_missing.extend(k8s::kueue::openssl_available().err());
    let kueue_possible = kueue_missing.is_empty();
    if !kueue_possible {
        if Assets::required() {
            eprintln!("realk8s: {}, and {REQUIRE_ENV}=1", kueue_missing.join("; "));
            return ExitCode::FAILURE;
        }
        let skipped = all
            .iter()
            .filter(|(_, n, _)| *n == Needs::FleetKueue)
            .count();
        println!(
            "realk8s: {skipped} Kueue scenario(s) skipped: {}",
            kueue_missing.join("; ")
        );
    }
    let skipped = all
        .iter()
        .filter(|(_, n, _)| matches!(n, Needs::Fleet | Needs::FleetJobSet | Needs::FleetKueue))
        .count();
    if !fleet_possible {
        if Assets::required() {
            eprintln!("realk8s: {}, and {REQUIRE_ENV}=1", missing.join("; "));
            return ExitCode::FAILURE;
        }
        println!(
            "realk8s: {skipped} of {} scenarios skipped: {}",
            all.len(),
            missing.join("; ")
        );
    }
    if let Err(e) = k8s::reaper::start() {
        eprintln!("realk8s: {e}");
        return ExitCode::FAILURE;
    }
    let dir = tempfile::Builder::new()
        .prefix("switchyard-realk8s-")
        .tempdir()
        .expect("a temporary directory");
    k8s::reaper::watch_dir(dir.path());
    switchyard::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    let suite = Arc::new(Suite {
        runtime,
        assets,
        dir,
        fleet: Default::default(),
        api: Default::default(),
        jobset: Default::default(),
        fleet_possible,
        failed: Default::default(),
    });
    let trials = all
        .into_iter()
        .filter(|(_, needs, _)| match needs {
            Needs::Api => true,
            Needs::Fleet => fleet_possible,
            Needs::JobSet => jobset_possible,
            Needs::FleetJobSet => fleet_possible && jobset_possible,
            Needs::FleetKueue => fleet_possible && kueue_possible,
        })
        .map(|(path, _, run)| {
            let name = path.rsplit("::").next().unwrap_or(path).trim().to_string();
            let module = path.split("::").next().unwrap_or("").trim().to_string();
            let suite = suite.clone();
            Trial::test(format!("{module}::{name}"), move || {
                let outcome = AssertUnwindSafe(run(suite.clone())).catch_unwind();
                match suite.runtime.block_on(outcome) {
                    Ok(()) => Ok(()),
                    Err(p) => {
                        suite
                            .failed
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                        Err(Failed::from(panic_text(p)))
                    }
                }
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let mut conclusion_code = conclusion.exit_code();
    // Checks over everything the scenarios did, once they are all done.
    if fleet_possible {
        let suite_for_final = suite.clone();
        let final_trials = vec![Trial::test(
            "dispatch::no_status_write_was_ever_refused",
            move || {
                let s = suite_for_final.clone();
                let outcome =
                    AssertUnwindSafe(dispatch::no_status_write_was_ever_refused(s)).catch_unwind();
                suite_for_final
                    .runtime
                    .block_on(outcome)
                    .map_err(|p| Failed::from(panic_text(p)))
            },
        )];
        let last = libtest_mimic::run(&args, final_trials);
        if last.has_failed() {
            suite
                .failed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            conclusion_code = ExitCode::FAILURE;
        }
    }
    let Ok(suite) = Arc::try_unwrap(suite) else {
        panic!("a scenario still holds the suite");
    };
    let failed = suite.failed.load(std::sync::atomic::Ordering::SeqCst);
    // Processes first (the runtime must outlive the clients they hold), then the files.
    suite.runtime.block_on(async {
        suite.fleet.lock().await.take();
        suite.api.lock().await.take();
        suite.jobset.lock().await.take();
    });
    let Suite { runtime, dir, .. } = suite;
    drop(runtime);
    if failed || std::env::var("SWITCHYARD_K8S_KEEP_LOGS").is_ok_and(|v| v == "1") {
        let kept = dir.keep();
        k8s::reaper::forget_dir(&kept);
        eprintln!(
            "realk8s: the logs of every process are kept in {}",
            kept.display()
        );
    }
    k8s::reaper::stop();
    conclusion_code
}
