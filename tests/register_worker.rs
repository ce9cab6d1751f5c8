//! `switchyard register-worker` as a user runs it, against a fake worker API server over HTTPS:
//! the manifests it prints register the worker (the manager's WorkerCluster controller connects
//! with their kubeconfig), and each way it can go wrong ends in one line that says what to do.

mod common;

use common::fake_api::{FakeApi, SECRETS};
use common::fleet::{reason_is, Fleet};
use serde_json::{json, Value};
use std::process::Output;

const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.dispatcher";

/// The token Secret as kube-apiserver returns it once the token controller filled it with
/// `token` and the worker's CA (`data` absent before that: `None`).
fn token_secret(api: &FakeApi, token: Option<&str>) -> Value {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut secret = json!({
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {
            "name": "switchyard-dispatcher-token",
            "namespace": "switchyard-system",
            "labels": {"app.kubernetes.io/name": "switchyard", "app.kubernetes.io/instance": "switchyard"},
            "annotations": {
                "kubernetes.io/service-account.name": "switchyard-dispatcher",
                "kubernetes.io/service-account.uid": "5b0b1f3e-7f1c-4c55-9d1e-2a4f3c9d8e71",
                "meta.helm.sh/release-name": "switchyard",
                "meta.helm.sh/release-namespace": "switchyard-system",
            },
            "creationTimestamp": "2026-11-29T12:00:00Z",
        },
        "type": "kubernetes.io/service-account-token",
    });
    if let Some(token) = token {
        let ca = api.ca_pem.as_deref().expect("an HTTPS worker");
        secret["data"] =
            json!({"ca.crt": b64(ca), "namespace": b64("switchyard-system"), "token": b64(token)});
    }
    api.upsert(SECRETS, secret)
}

async fn register(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .arg("register-worker")
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The admin's kubeconfig for the worker, in a file.
fn admin_kubeconfig(api: &FakeApi) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.kubeconfig");
    std::fs::write(&path, api.kubeconfig("admin-token")).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

/// The one line a failing run ends with (warnings may come before it).
fn error_of(out: &Output) -> String {
    assert!(!out.status.success(), "it should fail");
    assert!(out.stdout.is_empty(), "nothing to apply is printed");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("Warning: ") || l.starts_with("Error: ")),
        "warnings, then one error line: {stderr}"
    );
    let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("Error: ")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(lines.last().unwrap().starts_with("Error: "), "{stderr}");
    errors[0].to_string()
}

/// A run that succeeds, against a worker whose token Secret is filled, with `extra` arguments.
struct Registered {
    worker: FakeApi,
    stdout: String,
    stderr: String,
}

async fn registered(extra: &[&str]) -> Registered {
    let worker = FakeApi::start_tls().await;
    token_secret(&worker, Some(TOKEN));
    let (_dir, kubeconfig) = admin_kubeconfig(&worker);
    let mut all = args(&["w1", "--kubeconfig", &kubeconfig]);
    all.extend(args(extra));
    let out = register(all).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    Registered {
        worker,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_manifests_register_the_worker_with_the_manager() {
    let Registered {
        worker,
        stdout,
        stderr,
    } = registered(&[
        "--label",
        "tier=gold",
        "--scheduler-name",
        "switchyard-scheduler",
    ])
    .await;
    // The fake worker is on loopback, which the manager's pods would not reach.
    assert!(
        stderr.contains("loopback") && stderr.contains("--server"),
        "{stderr}"
    );

    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "a Secret and a WorkerCluster");
    let (secret, worker_cluster) = (&docs[0], &docs[1]);
    assert_eq!(secret["metadata"]["namespace"], "switchyard-system");
    assert_eq!(secret["metadata"]["name"], "w1-kubeconfig");
    assert_eq!(
        worker_cluster["spec"],
        json!({
            "kubeConfig": {"location": "w1-kubeconfig", "locationType": "Secret"},
            "labels": {"tier": "gold"},
            "schedulerName": "switchyard-scheduler",
        })
    );
    let made = secret["stringData"]["kubeconfig"].as_str().unwrap();
    let plain: Value = serde_yaml::from_str(made).unwrap();
    assert_eq!(
        plain["users"][0]["user"]["token"], TOKEN,
        "the dispatcher's token, not the admin's"
    );
    assert_eq!(plain["clusters"][0]["cluster"]["server"], worker.url());

    // The manager connects with it, as the dispatcher (the worker takes no other token now).
    worker.require_token(TOKEN);
    let fleet = Fleet::start().await;
    fleet.add("w1", made);
    fleet
        .wait_status("w1", "Active=True", reason_is("Connected"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_server_for_the_manager_is_written_and_not_checked_from_here() {
    // Port 1 on loopback: refused at once, as an address only the manager reaches would be.
    let Registered { stdout, stderr, .. } = registered(&[
        "--server",
        "https://127.0.0.1:1",
        "--manager-namespace",
        "batch-system",
    ])
    .await;
    assert!(
        stderr.contains("could not check the kubeconfig against https://127.0.0.1:1"),
        "{stderr}"
    );
    assert!(stdout.contains("server: https://127.0.0.1:1"), "{stdout}");
    // The manager runs in a namespace of its own: the kubeconfig Secret goes there.
    assert!(stdout.contains("namespace: batch-system"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_the_token_secret_is_told_to_install_the_chart() {
    let worker = FakeApi::start_tls().await;
    let (_dir, kubeconfig) = admin_kubeconfig(&worker);
    let err = error_of(&register(args(&["w1", "--kubeconfig", &kubeconfig])).await);
    assert!(
        err.contains("no Secret switchyard-system/switchyard-dispatcher-token")
            && err.contains("role=worker"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_secret_never_filled_is_waited_for_then_reported() {
    let worker = FakeApi::start_tls().await;
    token_secret(&worker, None);
    let (_dir, kubeconfig) = admin_kubeconfig(&worker);
    let err = error_of(&register(args(&["w1", "--kubeconfig", &kubeconfig, "--wait", "1"])).await);
    assert!(
        err.contains("has no token after 1s") && err.contains("kube-controller-manager"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_the_worker_refuses_is_reported_not_printed() {
    let worker = FakeApi::start_tls().await;
    token_secret(&worker, Some("revoked-token"));
    // The admin reads the Secret; the token in it is not accepted.
    worker.require_token("admin-token");
    let (_dir, kubeconfig) = admin_kubeconfig(&worker);
    let err = error_of(&register(args(&["w1", "--kubeconfig", &kubeconfig])).await);
    assert!(
        err.contains("the dispatcher's token cannot list Jobs in the worker"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_kubeconfigs_and_unreachable_workers_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.kubeconfig");
    let err = error_of(&register(args(&["w1", "--kubeconfig", missing.to_str().unwrap()])).await);
    assert!(err.contains("cannot read the worker's kubeconfig"), "{err}");

    let garbage = dir.path().join("garbage.kubeconfig");
    std::fs::write(&garbage, "clusters: [oops").unwrap();
    let err = error_of(&register(args(&["w1", "--kubeconfig", garbage.to_str().unwrap()])).await);
    assert!(err.contains("cannot read the worker's kubeconfig"), "{err}");

    let worker = FakeApi::start_tls().await;
    let (_dir, kubeconfig) = admin_kubeconfig(&worker);
    let err = error_of(
        &register(args(&[
            "w1",
            "--kubeconfig",
            &kubeconfig,
            "--context",
            "elsewhere",
        ]))
        .await,
    );
    assert!(err.contains("elsewhere"), "{err}");

    worker.shut_down();
    let err = error_of(&register(args(&["w1", "--kubeconfig", &kubeconfig])).await);
    assert!(
        err.contains(
            "cannot read Secret switchyard-system/switchyard-dispatcher-token in the worker"
        ),
        "{err}"
    );
    // The cause is said, not only kube's "client error (Connect)".
    assert!(err.contains("Connection refused"), "{err}");

    let err = error_of(&register(args(&["Not_A_Name", "--kubeconfig", &kubeconfig])).await);
    assert!(err.contains("not a WorkerCluster name"), "{err}");
    for (flag, what) in [
        ("--namespace", "namespace"),
        ("--manager-namespace", "namespace"),
        ("--token-secret", "Secret"),
    ] {
        let out = register(args(&["w1", "--kubeconfig", &kubeconfig, flag, "Bad NS"])).await;
        let err = error_of(&out);
        assert!(
            err.contains(&format!("{flag} \"Bad NS\" is not a {what} name")),
            "{err}"
        );
    }
}

/// A kubeconfig's `exec` credential plugin that never returns is given up on after
/// `--request-timeout`, with a line that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_plugin_that_never_returns_is_given_up_on() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("exec.kubeconfig");
    std::fs::write(
        &kubeconfig,
        r#"apiVersion: v1
kind: Config
clusters:
- name: worker
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: admin
  user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: sleep, args: ["60"], interactiveMode: Never}}
contexts:
- name: worker
  context: {cluster: worker, user: admin}
current-context: worker
"#,
    )
    .unwrap();
    // To files, not pipes: the plugin, left running, holds what it inherited open.
    let (stdout, stderr) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args([
        "register-worker",
        "w1",
        "--request-timeout",
        "1",
        "--kubeconfig",
    ])
    .arg(&kubeconfig)
    .env_remove("KUBECONFIG")
    .stdout(std::fs::File::create(&stdout).unwrap())
    .stderr(std::fs::File::create(&stderr).unwrap());
    let status = tokio::task::spawn_blocking(move || cmd.status().unwrap())
        .await
        .unwrap();
    let out = Output {
        status,
        stdout: std::fs::read(&stdout).unwrap(),
        stderr: std::fs::read(&stderr).unwrap(),
    };
    let err = error_of(&out);
    assert!(
        err.contains("credential plugin did not return within 1s"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_manager_would_refuse_is_an_error_not_a_warning() {
    let worker = FakeApi::start_tls().await;
    token_secret(&worker, Some(TOKEN));
    let (_dir, kubeconfig) = admin_kubeconfig(&worker);
    let out = register(args(&[
        "w1",
        "--kubeconfig",
        &kubeconfig,
        "--server",
        "http://10.0.0.7:8080",
    ]))
    .await;
    let err = error_of(&out);
    assert!(err.contains("not https"), "{err}");
    // Refused before the kubeconfig is tried: no warning that it could not be checked.
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("could not check"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
