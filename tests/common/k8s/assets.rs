//! Where the Kubernetes binaries come from: `SWITCHYARD_K8S_ASSETS` (a folder with
//! `kube-apiserver`, `etcd`, and `kube-controller-manager` and `kube-scheduler` for the tests
//! that need them; `.ci/run` fills one under `target/`), else `KUBEBUILDER_ASSETS` (the folder
//! `setup-envtest use -p path` prints, with `kube-apiserver` and `etcd`). The JobSet
//! controller is `jobset-controller` in the same folder, or the file `SWITCHYARD_JOBSET_CONTROLLER`
//! names (an envtest folder has none); the Kueue controller manager likewise `kueue-controller`
//! or `SWITCHYARD_KUEUE_CONTROLLER`.

use std::path::{Path, PathBuf};

pub const ASSETS_ENV: &str = "SWITCHYARD_K8S_ASSETS";
pub const ENVTEST_ENV: &str = "KUBEBUILDER_ASSETS";
/// Set to 1, tests that would skip for want of assets fail instead (CI sets it).
pub const REQUIRE_ENV: &str = "SWITCHYARD_REQUIRE_K8S";
/// The JobSet controller binary, where it is not `jobset-controller` in the assets folder.
pub const JOBSET_CONTROLLER_ENV: &str = "SWITCHYARD_JOBSET_CONTROLLER";
/// The Kueue controller manager binary, where it is not `kueue-controller` in the assets folder.
pub const KUEUE_CONTROLLER_ENV: &str = "SWITCHYARD_KUEUE_CONTROLLER";

#[derive(Debug, Clone)]
pub struct Assets {
    /// The variable and folder they came from, for messages.
    pub source: String,
    pub apiserver: PathBuf,
    pub etcd: PathBuf,
    pub controller_manager: Option<PathBuf>,
    pub scheduler: Option<PathBuf>,
    /// The JobSet controller (v0.11.0 is tested), for the tests that run JobSets.
    pub jobset_controller: Option<PathBuf>,
    /// The Kueue controller manager (v0.13.1 is tested), for the tests of Kueue workers.
    pub kueue_controller: Option<PathBuf>,
}

/// The file `var` names, if executable, else `name` in the assets folder.
fn named_or_beside(var: &str, beside: Option<PathBuf>) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .filter(|p| executable(p))
        .or(beside)
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Assets {
    /// The assets named by the environment, or why there are none.
    pub fn find() -> Result<Self, String> {
        for var in [ASSETS_ENV, ENVTEST_ENV] {
            let Some(dir) = std::env::var_os(var).filter(|d| !d.is_empty()) else {
                continue;
            };
            let dir = PathBuf::from(dir);
            let source = format!("{var}={}", dir.display());
            let at = |name: &str| {
                let path = dir.join(name);
                executable(&path).then_some(path)
            };
            let (Some(apiserver), Some(etcd)) = (at("kube-apiserver"), at("etcd")) else {
                return Err(format!(
                    "{source} holds no executable kube-apiserver and etcd"
                ));
            };
            return Ok(Self {
                source,
                apiserver,
                etcd,
                controller_manager: at("kube-controller-manager"),
                scheduler: at("kube-scheduler"),
                jobset_controller: named_or_beside(JOBSET_CONTROLLER_ENV, at("jobset-controller")),
                kueue_controller: named_or_beside(KUEUE_CONTROLLER_ENV, at("kueue-controller")),
            });
        }
        Err(format!(
            "no Kubernetes binaries: set {ASSETS_ENV} (or {ENVTEST_ENV}) to a folder with kube-apiserver and etcd"
        ))
    }

    /// Whether a missing asset fails the tests instead of skipping them.
    pub fn required() -> bool {
        std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
    }

    /// The binaries a control plane with a controller manager and a scheduler needs that
    /// these assets lack.
    pub fn missing_for_full(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.controller_manager.is_none() {
            missing.push("kube-controller-manager");
        }
        if self.scheduler.is_none() {
            missing.push("kube-scheduler");
        }
        missing
    }

    /// Why the JobSet controller cannot be run, if it cannot.
    pub fn missing_jobset_controller(&self) -> Option<String> {
        self.jobset_controller.is_none().then(|| {
            format!(
                "jobset-controller is not in {} (nor named by {JOBSET_CONTROLLER_ENV})",
                self.source
            )
        })
    }

    /// Why the Kueue controller manager cannot be run, if it cannot.
    pub fn missing_kueue_controller(&self) -> Option<String> {
        self.kueue_controller.is_none().then(|| {
            format!(
                "kueue-controller is not in {} (nor named by {KUEUE_CONTROLLER_ENV})",
                self.source
            )
        })
    }
}
