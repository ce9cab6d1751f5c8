//! The `switchyard` binary as a user runs it: certificates, configuration errors, and a
//! graceful stop on SIGTERM that lets an in-flight review finish.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn switchyard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// Runs `cmd`, which must succeed (else its stderr is the failure), and returns its stdout.
fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn certs_writes_a_ca_and_a_serving_pair_that_load() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pki");
    let status = switchyard()
        .args(["certs", "--out"])
        .arg(&out)
        .args([
            "--dns",
            "switchyard-webhook.switchyard-system.svc",
            "--ip",
            "10.0.0.7",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        assert!(out.join(f).exists(), "{f}");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out.join("tls.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the key is private to its owner");
    switchyard::install_crypto_provider();
    switchyard::tls::load_certified_key(&out.join("tls.crt"), &out.join("tls.key")).unwrap();
}

#[test]
fn configuration_mistakes_are_reported_by_name_and_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let out = switchyard()
        .args(["serve", "--standalone"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dev-tls"));

    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "listen: 127.0.0.1:0\ndefaultQeue: research\n").unwrap();
    let out = switchyard()
        .args(["serve", "--standalone", "--dev-tls"])
        .arg(dir.path())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("defaultQeue") && err.contains("config.yaml"),
        "{err}"
    );

    let out = switchyard()
        .args([
            "serve",
            "--standalone",
            "--tls-cert",
            "/nonexistent/tls.crt",
            "--tls-key",
            "/nonexistent/tls.key",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/tls.crt"));

    // A kubeconfig that does not parse: a clear error, no panic.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nclusters: [[[\n").unwrap();
    let out = switchyard()
        .args(["serve", "--dev-tls"])
        .arg(dir.path())
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(["--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--standalone") && !err.contains("panicked"),
        "{err}"
    );
    // The YAML parser's picture of the input (a caret under the column) stays out of it.
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("line 2 column"), "{err}");

    // A port in use: the OS error once, and what to check.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let out = output_within(
        switchyard()
            .args(["serve", "--standalone", "--dev-tls"])
            .arg(dir.path())
            .args(["--listen", &port, "--probe-listen", "127.0.0.1:0"]),
        30,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {port}"))
            && err.contains("is another process using the port")
            && err.matches("(os error 98)").count() == 1,
        "{err}"
    );

    // certs into a path under a file: the OS error once, and what is in the way.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = switchyard()
        .args(["certs", "--out"])
        .arg(file.join("pki"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a file is in the way") && err.matches("(os error 20)").count() == 1,
        "{err}"
    );
}

/// Runs `cmd` to completion; one still running after `secs` is killed and fails the test.
fn output_within(cmd: &mut Command, secs: u64) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {secs}s:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    child.wait_with_output().unwrap()
}

/// A `serve` started with JSON logs on loopback ports.
fn spawn_serve(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Child {
    let mut cmd = switchyard();
    cmd.args(["--log-format", "json", "serve"])
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Waits (up to 20 s) for the "serving" log line and returns the lines logged before it; the
/// process exiting first fails the test with what it logged.
fn wait_serving(child: &mut Child) -> Vec<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if serde_json::from_str::<serde_json::Value>(&line)
                    .is_ok_and(|v| v["message"] == "serving")
                {
                    // Keep draining so the server never blocks on a full pipe.
                    std::thread::spawn(move || for _ in rx {});
                    return seen;
                }
                seen.push(line);
            }
            Err(_) => {
                let _ = child.kill();
                panic!("serve never logged \"serving\":\n{}", seen.join("\n"));
            }
        }
    }
}

fn sigterm(child: &Child) {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}

/// Waits (up to 20 s) for the process to exit and returns its exit code (`None`: a signal).
fn exit_code(child: &mut Child) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve did not exit within 20 s");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn the_flags_choice_of_certificate_replaces_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "tlsCert: /nonexistent/tls.crt\ntlsKey: /nonexistent/tls.key\n",
    )
    .unwrap();
    let pki = dir.path().join("pki");
    let (config_arg, pki_arg) = (config.to_str().unwrap(), pki.to_str().unwrap());
    let mut child = spawn_serve(
        &["--standalone", "--config", config_arg, "--dev-tls", pki_arg],
        dir.path(),
        &[],
    );
    wait_serving(&mut child);
    assert!(pki.join("ca.crt").exists(), "serving with --dev-tls");
    sigterm(&child);
    assert_eq!(exit_code(&mut child), Some(0));

    // One source giving both a pair and devTls is refused, naming the keys.
    std::fs::write(
        &config,
        format!("tlsCert: /x/tls.crt\ntlsKey: /x/tls.key\ndevTls: {pki_arg}\n"),
    )
    .unwrap();
    let out = output_within(
        switchyard().args(["serve", "--standalone", "--config", config_arg]),
        20,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tlsCert/tlsKey") && err.contains("devTls"),
        "{err}"
    );
}

/// What `simulate --scenario PATH` prints on stderr when it fails, with `RUST_BACKTRACE` set to
/// `backtrace` as a developer's shell may have it; the exit code must be 1.
fn simulate_failure(path: &Path, backtrace: &str) -> String {
    let out = switchyard()
        .args(["simulate", "--scenario"])
        .arg(path)
        .env("RUST_BACKTRACE", backtrace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A mistake on the command line is one line on stderr that names it, each cause once, and
/// no backtrace even where the shell sets `RUST_BACKTRACE` (the user did nothing wrong in
/// Switchyard's code).
#[test]
fn a_failing_command_says_why_in_one_line_without_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let err = simulate_failure(&dir.path().join("missing.yaml"), "1");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("Error: cannot read scenario") && err.contains("missing.yaml"),
        "{err}"
    );
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");

    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "clusters: [\n").unwrap();
    let err = simulate_failure(&broken, "full");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("line 2 column 1"), "{err}");
}

/// `switchyard simulate | head` and the like: a reader that stops reading early ends the
/// output, not the command, and no panic is printed; a `--report` asked for is still written.
#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    // More output than a pipe buffers (64 KiB), so the write meets the closed pipe.
    let mut scenario = String::from(
        "clusters:\n  - name: c\n    nodes: [{name: n, allocatable: {cpu: \"8\", memory: 32Gi, pods: \"110\"}}]\n\
         queues:\n  - {name: q, clusters: [c]}\njobs:\n",
    );
    for j in 0..2000 {
        scenario.push_str(&format!(
            "  - {{name: job-{j}, queue: q, submitAt: {j}s, parallelism: 1, duration: 60s, template: {{containers: [{{name: m, resources: {{requests: {{cpu: \"1\"}}}}}}]}}}}\n"
        ));
    }
    let path = dir.path().join("many.yaml");
    std::fs::write(&path, scenario).unwrap();
    let report = dir.path().join("report.html");
    let runs: [&[&str]; 2] = [&["crds"], &["simulate", "--strategy", "all", "--report"]];
    for args in runs {
        let mut cmd = switchyard();
        cmd.args(args);
        if args[0] == "simulate" {
            cmd.arg(&report).arg("--scenario").arg(&path);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("many.yaml") && html.trim_end().ends_with("</html>"));
}

#[test]
fn a_log_filter_that_does_not_parse_stops_serve() {
    let dir = tempfile::tempdir().unwrap();
    let out = output_within(
        switchyard()
            .args(["serve", "--standalone", "--dev-tls"])
            .arg(dir.path())
            .args(["--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "switchyard=loud"),
        20,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RUST_LOG") && err.contains("switchyard=loud"),
        "{err}"
    );
}

#[test]
fn text_logs_into_a_pipe_carry_no_colour_codes() {
    // What a container runtime, systemd or `serve 2> file` receives: a pipe, not a terminal.
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let mut child = switchyard()
        .args(["--log-format", "text", "serve", "--standalone", "--dev-tls"])
        .arg(&pki)
        .args(["--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"])
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.contains("serving")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("serve never logged \"serving\":\n{}", lines.join("\n"));
            }
        }
    }
    sigterm(&child);
    assert_eq!(exit_code(&mut child), Some(0));
    lines.extend(rx.try_iter());
    let coloured: Vec<&String> = lines.iter().filter(|l| l.contains('\u{1b}')).collect();
    assert!(
        coloured.is_empty(),
        "log lines written to a pipe carry ANSI escape codes: {coloured:?}"
    );
}

#[test]
fn sigterm_during_start_up_exits_zero() {
    // A kubeconfig whose exec credential plugin takes a while, as cloud plugins can: the
    // Kubernetes client is being built when SIGTERM arrives.
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("plugin-started");
    let plugin = dir.path().join("credential.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ntouch '{}'\nsleep 2\necho '{{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t\"}}}}'\n",
            started.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster: {{server: \"https://127.0.0.1:1\"}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: {}\n      interactiveMode: Never\n",
            plugin.display()
        ),
    )
    .unwrap();
    let pki = dir.path().join("pki");
    let mut child = spawn_serve(
        &["--dev-tls", pki.to_str().unwrap()],
        dir.path(),
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !started.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve exited ({status}) before the credential plugin ran");
        }
        assert!(Instant::now() < deadline, "the credential plugin never ran");
        std::thread::sleep(Duration::from_millis(25));
    }
    sigterm(&child);
    std::thread::spawn({
        let stderr = child.stderr.take().unwrap();
        move || for _ in BufReader::new(stderr).lines() {}
    });
    assert_eq!(
        exit_code(&mut child),
        Some(0),
        "a SIGTERM during start-up is a clean stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_in_flight_review_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = switchyard()
        .args(["--log-format", "json", "serve", "--standalone", "--dev-tls"])
        .arg(dir.path())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--probe-listen",
            "127.0.0.1:0",
            "--shutdown-timeout",
            "10s",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The JSON log line "serving" carries the bound addresses.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("serve logs before exiting").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["message"] == "serving" {
            break v["https_addr"]
                .as_str()
                .unwrap()
                .parse::<std::net::SocketAddr>()
                .unwrap();
        }
    };
    std::thread::spawn(move || for _ in lines {});

    // Start a review, send half its body, then SIGTERM.
    let tls = common::tls_client::connector_from_dir(dir.path());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut stream = tls
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let body = common::fixture("admission-mutate-create-basic");
    let head = format!(
        "POST /mutate-batch-v1-job HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..body.len() / 2]).await.unwrap();
    stream.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The server no longer accepts new connections: refused at once, not left hanging...
    let refused = tokio::time::timeout(Duration::from_secs(2), async {
        match tokio::net::TcpStream::connect(addr).await {
            Err(_) => true,
            Ok(tcp) => tls
                .connect(
                    rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                    tcp,
                )
                .await
                .is_err(),
        }
    })
    .await
    .expect("a new connection is refused within 2 s while shutting down, not left hanging");
    assert!(refused, "new connections are refused while shutting down");

    // ...but the in-flight review completes.
    stream.write_all(&body[body.len() / 2..]).await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"allowed\":true"), "{reply}");

    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
}

#[test]
fn topology_merge_reads_cases_and_writes_results_as_the_vectors_do() {
    use std::io::Write;
    let vectors: serde_json::Value = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/topology/edge.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let cases: Vec<_> = vectors
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["case"].clone())
        .collect();
    let mut child = switchyard()
        .args(["topology", "merge"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&cases).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let results: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results.len(), cases.len());
    for (got, v) in results.iter().zip(vectors.as_array().unwrap()) {
        let want = &v["expected"];
        assert_eq!(
            got.get("error").is_some(),
            want.get("error").is_some(),
            "{got} vs {want}"
        );
        if want.get("error").is_none() {
            assert_eq!(got, want);
        }
    }
    let out = switchyard()
        .args(["topology", "merge"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(b"{not json").unwrap();
            c.wait_with_output()
        })
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("merge cases"));
}

#[test]
fn explain_shows_hints_merged_hint_verdict_and_score() {
    let text = stdout_of(
        switchyard()
            .args(["explain", "--inventory"])
            .arg(example("inventory.yaml"))
            .arg("--pod")
            .arg(example("gpu-pod.yaml"))
            .args(["--node", "eu-1-gpu-a"]),
    );
    for part in [
        "nvidia.com/gpu: hints {1}* {0,1}",
        "merged {1}* -> admit",
        "score (LeastAllocated)",
    ] {
        assert!(text.contains(part), "missing {part:?} in\n{text}");
    }
    let out = switchyard()
        .args([
            "explain",
            "--inventory",
            "/nonexistent.yaml",
            "--pod",
            "/nonexistent.yaml",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.yaml"));
}

#[test]
fn explain_judges_a_cluster_as_its_virtual_node_is_judged() {
    // The example GPU pod, sent to virtual nodes the usual way.
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.yaml");
    let gpu_pod = std::fs::read_to_string(example("gpu-pod.yaml")).unwrap();
    let explain = |pod_text: String| {
        std::fs::write(&pod, pod_text).unwrap();
        stdout_of(
            switchyard()
                .args(["explain", "--inventory"])
                .arg(example("inventory.yaml"))
                .arg("--pod")
                .arg(&pod)
                .args(["--cluster", "eu-1"]),
        )
    };
    let gang_of_one = gpu_pod.replace("gang-size: \"2\"", "gang-size: \"1\"");
    let selecting = |selector: &str| {
        gang_of_one.replace(
            "spec:\n  tolerations:",
            &format!("spec:\n  nodeSelector: {selector}\n  tolerations:"),
        )
    };
    let text = explain(selecting("{type: virtual-kubelet, region: europe}"));
    assert!(
        text.contains("cluster eu-1: 1 pod(s) fit on eu-1-gpu-a×1"),
        "the virtual node's own labels were asked of the nodes:\n{text}"
    );
    assert!(text.contains("as virtual node switchyard-eu-1"), "{text}");
    assert!(!text.contains("does not have label type"), "{text}");
    let text = explain(selecting("{switchyard.dev/cluster: us-1}"));
    assert!(
        text.contains("cluster eu-1: does not fit: node switchyard-eu-1 does not have label switchyard.dev/cluster=us-1 (nodeSelector)"),
        "{text}"
    );
}

/// A JSON value with its objects' keys in the order they were written (serde_json's `Value`
/// sorts them).
#[derive(Debug)]
enum Ordered {
    Map(Vec<(String, Ordered)>),
    List(Vec<Ordered>),
    Leaf(serde_json::Value),
}

impl Ordered {
    fn keys(&self) -> Vec<&str> {
        match self {
            Ordered::Map(m) => m.iter().map(|(k, _)| k.as_str()).collect(),
            _ => Vec::new(),
        }
    }
    fn get(&self, key: &str) -> &Ordered {
        match self {
            Ordered::Map(m) => m
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("no {key:?} in {self:?}")),
            _ => panic!("{self:?} is not an object"),
        }
    }
    fn items(&self) -> &[Ordered] {
        match self {
            Ordered::List(l) => l,
            _ => panic!("{self:?} is not a list"),
        }
    }
    fn leaf(&self) -> &serde_json::Value {
        match self {
            Ordered::Leaf(v) => v,
            _ => panic!("{self:?} is not a scalar"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Ordered, E> {
                Ok(Ordered::Leaf(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Ordered, E> {
                Ok(Ordered::Leaf(v.into()))
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Leaf(serde_json::Value::Null))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = s.next_element()? {
                    out.push(e);
                }
                Ok(Ordered::List(out))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Ordered, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Ordered>()? {
                    out.push((k, v));
                }
                Ok(Ordered::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// The example of tests/data/formats/simulate-output.md.
fn simulate_output_example() -> Ordered {
    let doc = include_str!("data/formats/simulate-output.md");
    let start = doc.find("```json").expect("a json block") + "```json".len();
    let end = start + doc[start..].find("```").expect("its end");
    serde_json::from_str(&doc[start..end]).expect("the format's example is JSON")
}

fn simulate(output: &str) -> String {
    stdout_of(switchyard().args(["simulate", "--output", output]))
}

#[test]
fn simulate_json_follows_the_documented_format() {
    let format = simulate_output_example();
    let text = simulate("json");
    let got: Ordered = serde_json::from_str(&text).expect("one JSON object");
    assert_eq!(got.keys(), format.keys(), "top-level keys, in order");
    assert_eq!(got.get("strategy").leaf(), "switchyard");
    let job_keys = format.get("jobs").items()[0].keys();
    let jobs = got.get("jobs").items();
    assert_eq!(jobs.len(), 7, "the bundled scenario's Jobs");
    let number_or_null = |v: &serde_json::Value| v.is_number() || v.is_null();
    for j in jobs {
        assert_eq!(j.keys(), job_keys, "a job's keys, in order");
        for k in ["name", "namespace", "queue"] {
            assert!(j.get(k).leaf().is_string(), "{k}: {j:?}");
        }
        assert!(j.get("cluster").leaf().is_string() || j.get("cluster").leaf().is_null());
        for k in ["submitted", "admitted", "started", "finished"] {
            assert!(number_or_null(j.get(k).leaf()), "{k}: {j:?}");
        }
        let result = j.get("result").leaf().as_str().unwrap();
        assert!(
            ["Succeeded", "Failed", "Pending", "Deactivated"].contains(&result),
            "{result}"
        );
        assert!(j.get("requeues").leaf().is_u64());
        let reason = j.get("reason").leaf();
        assert_eq!(
            reason.is_string(),
            result != "Succeeded",
            "a reason exactly when not Succeeded: {j:?}"
        );
    }
    let summary = got.get("summary");
    assert_eq!(
        summary.keys(),
        format.get("summary").keys(),
        "summary keys, in order"
    );
    for k in [
        "jobs",
        "succeeded",
        "failed",
        "pending",
        "topologyAffinityErrors",
    ] {
        assert!(summary.get(k).leaf().is_u64(), "{k}");
    }
    assert_eq!(summary.get("jobs").leaf(), 7);
    for k in ["makespan", "meanWait", "remoteWritesPerJob"] {
        assert!(summary.get(k).leaf().is_number(), "{k}");
    }
    let util = summary.get("utilization");
    assert_eq!(util.keys(), ["cpu-central", "gpu-east", "gpu-west"]);
    let quota = summary.get("maxQuotaUsage");
    assert_eq!(quota.keys(), ["batch", "training"]);
    if let Ordered::Map(queues) = quota {
        for (_, per) in queues {
            if let Ordered::Map(resources) = per {
                for (r, v) in resources {
                    let x = v.leaf().as_f64().unwrap();
                    assert!((0.0..=1.0).contains(&x), "{r}: {x}");
                }
            }
        }
    }
}

#[test]
fn simulate_text_shows_the_same_jobs_as_a_table_and_the_summary() {
    let json: serde_json::Value = serde_json::from_str(&simulate("json")).unwrap();
    let text = simulate("text");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "strategy: switchyard");
    let header: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "NAMESPACE",
            "QUEUE",
            "CLUSTER",
            "SUBMITTED",
            "ADMITTED",
            "STARTED",
            "FINISHED",
            "RESULT",
            "REQUEUES"
        ]
    );
    let cell = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for (i, j) in json["jobs"].as_array().unwrap().iter().enumerate() {
        let row: Vec<&str> = lines[3 + i].split_whitespace().collect();
        let want: Vec<String> = [
            "name",
            "namespace",
            "queue",
            "cluster",
            "submitted",
            "admitted",
            "started",
            "finished",
            "result",
            "requeues",
        ]
        .iter()
        .map(|k| cell(&j[k]))
        .collect();
        assert_eq!(row, want, "row {i}");
    }
    let s = &json["summary"];
    let deactivated = json["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["result"] == "Deactivated")
        .count();
    let counts = format!(
        "jobs {}: {} succeeded, {} failed, {} pending",
        s["jobs"], s["succeeded"], s["failed"], s["pending"]
    );
    for line in [
        if deactivated > 0 {
            format!("{counts}, {deactivated} deactivated")
        } else {
            counts
        },
        format!(
            "makespan: {}s   mean wait: {}s",
            s["makespan"], s["meanWait"]
        ),
        format!("TopologyAffinityErrors: {}", s["topologyAffinityErrors"]),
        format!("remote writes per job: {}", s["remoteWritesPerJob"]),
    ] {
        assert!(
            lines.contains(&line.as_str()),
            "missing {line:?} in\n{text}"
        );
    }
    for j in json["jobs"].as_array().unwrap() {
        if let Some(reason) = j["reason"].as_str() {
            let line = format!("  {}/{}: {reason}", cell(&j["namespace"]), cell(&j["name"]));
            assert!(lines.contains(&line.as_str()), "missing {line:?}");
        }
    }
    assert!(
        text.contains("max quota usage of batch: cpu 1, memory 0.5"),
        "{text}"
    );
}

/// What each Job of the bundled example went through, under every strategy, is what the binary
/// printed before the summary grew (the expected files are that binary's `--output json`); so
/// is every summary figure it had then.
#[test]
fn simulate_the_bundled_jobs_end_as_they_did_before_for_every_strategy() {
    let expected = [
        (
            "switchyard",
            include_str!("data/simulate/bundled-switchyard.json"),
        ),
        (
            "all-at-once",
            include_str!("data/simulate/bundled-all-at-once.json"),
        ),
        (
            "sum-aggregate",
            include_str!("data/simulate/bundled-sum-aggregate.json"),
        ),
    ];
    for (strategy, before) in expected {
        let before: serde_json::Value = serde_json::from_str(before).unwrap();
        let out = switchyard()
            .args(["simulate", "--output", "json", "--strategy", strategy])
            .output()
            .unwrap();
        assert!(out.status.success(), "{strategy}");
        let now: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(now["strategy"], strategy);
        assert_eq!(now["jobs"], before["jobs"], "{strategy}: the jobs");
        let old = before["summary"].as_object().unwrap();
        for (k, v) in old {
            assert_eq!(&now["summary"][k], v, "{strategy}: summary.{k}");
        }
    }
}

#[test]
fn simulate_the_new_summary_figures_have_the_documented_shape() {
    let format = simulate_output_example();
    let got: Ordered = serde_json::from_str(&simulate("json")).unwrap();
    let (want, summary) = (format.get("summary"), got.get("summary"));
    for spread in ["startWait", "completionTime"] {
        assert_eq!(
            summary.get(spread).keys(),
            want.get(spread).keys(),
            "{spread}"
        );
    }
    assert_eq!(
        summary.get("topologyAffinityErrorsByCluster").keys(),
        ["cpu-central", "gpu-east", "gpu-west"],
        "every worker"
    );
    assert_eq!(summary.get("byQueue").keys(), ["batch", "training"]);
    assert_eq!(summary.get("byKind").keys(), ["cpu-only", "nvidia.com/gpu"]);
    let breakdown = want.get("byQueue").get("research").keys();
    for group in ["byQueue", "byKind"] {
        if let Ordered::Map(entries) = summary.get(group) {
            for (name, b) in entries {
                assert_eq!(b.keys(), breakdown, "{group} {name}");
            }
        }
    }
    // The batch queue asks for CPUs and memory only; training also for GPUs.
    assert_eq!(
        summary.get("byQueue").get("batch").get("goodput").keys(),
        ["cpu", "memory"]
    );
    assert_eq!(
        summary.get("goodput").keys(),
        ["cpu", "memory", "nvidia.com/gpu"]
    );
}

#[test]
fn simulate_all_strategies_give_three_reports_side_by_side() {
    let run = |args: &[&str]| -> String { stdout_of(switchyard().arg("simulate").args(args)) };
    let strategies = ["switchyard", "all-at-once", "sum-aggregate"];

    let all: serde_json::Value =
        serde_json::from_str(&run(&["--strategy", "all", "--output", "json"])).unwrap();
    let reports = all.as_array().expect("a JSON array");
    assert_eq!(reports.len(), 3);
    for (report, strategy) in reports.iter().zip(strategies) {
        assert_eq!(report["strategy"], strategy);
        let alone: serde_json::Value =
            serde_json::from_str(&run(&["--strategy", strategy, "--output", "json"])).unwrap();
        assert_eq!(report, &alone, "{strategy}: as when run alone");
    }

    let text = run(&["--strategy", "all"]);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["FIGURE", "switchyard", "all-at-once", "sum-aggregate"]
    );
    let row = |figure: &str| -> Vec<&str> {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("{figure} ")))
            .unwrap_or_else(|| panic!("no row {figure:?} in\n{text}"));
        line[figure.len()..].split_whitespace().collect()
    };
    let cells = |key: &str| -> Vec<String> {
        reports
            .iter()
            .map(|r| r["summary"][key].to_string())
            .collect()
    };
    for (figure, key) in [
        ("succeeded", "succeeded"),
        ("topologyAffinityErrors", "topologyAffinityErrors"),
        ("remoteWritesPerJob", "remoteWritesPerJob"),
    ] {
        assert_eq!(row(figure), cells(key), "{figure}");
    }
    let p95: Vec<String> = reports
        .iter()
        .map(|r| r["summary"]["startWait"]["p95"].to_string())
        .collect();
    assert_eq!(row("startWait p95"), p95);
    assert_eq!(row("deactivated"), ["1", "1", "1"]);
    // Then each strategy's jobs, in the same order.
    let sections: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("strategy: "))
        .collect();
    assert_eq!(sections, strategies);
}

#[test]
fn simulate_report_writes_a_page_and_changes_nothing_printed() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let run = |extra: &[&str]| {
        stdout_of(
            switchyard()
                .args(["simulate", "--strategy", "all", "--output", "json"])
                .args(extra),
        )
        .into_bytes()
    };
    let plain = run(&[]);
    let with_page = run(&["--report", page.to_str().unwrap()]);
    // Keeping what was in use over time decides nothing.
    assert_eq!(plain, with_page);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("examples/scenario.yaml (bundled)"));
    for s in ["switchyard", "all-at-once", "sum-aggregate"] {
        assert!(html.contains(&format!("<th scope=\"col\">{s}</th>")), "{s}");
    }
}

#[test]
fn simulate_report_to_a_path_that_cannot_be_written_says_so_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("report.html");
    let out = switchyard()
        .args(["simulate", "--report", path.to_str().unwrap()])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot write the report to {}", path.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Nothing was simulated: no report printed.
    assert!(out.stdout.is_empty());
}

/// `switchyard simulate --scenario examples/<scenario>` with `args`.
/// A file of the bundled `examples/`.
fn example(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

fn simulate_example(scenario: &str, args: &[&str]) -> String {
    stdout_of(
        switchyard()
            .args(["simulate", "--scenario"])
            .arg(example(scenario))
            .args(args),
    )
}

fn simulate_jobsets(args: &[&str]) -> String {
    simulate_example("jobset-scenario.yaml", args)
}

#[test]
fn simulate_the_jobset_example_ends_as_its_comments_say() {
    let text = simulate_jobsets(&[]);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(&header[..3], ["NAME", "KIND", "NAMESPACE"], "{text}");
    let row = |name: &str| -> Vec<&str> {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .split_whitespace()
            .collect()
    };
    // name, kind, namespace, queue, cluster, …, result.
    for (name, kind, cluster, result) in [
        ("pretrain", "JobSet", "gpu-large", "Succeeded"),
        ("finetune", "JobSet", "gpu-small", "Succeeded"),
        ("eval", "JobSet", "gpu-small", "Succeeded"),
        ("tokenize", "Job", "gpu-small", "Succeeded"),
    ] {
        let r = row(name);
        assert_eq!((r[1], r[4], r[9]), (kind, cluster, result), "{text}");
    }
    // eval waited for finetune's GPUs: admitted when finetune finished.
    assert_eq!(row("eval")[6], row("finetune")[8], "{text}");
    assert!(!text.contains("why:"), "{text}");

    // The JSON: every entry has the format's keys in order; a JobSet's then says its kind.
    let format = simulate_output_example();
    let job_keys = format.get("jobs").items()[0].keys();
    let got: Ordered = serde_json::from_str(&simulate_jobsets(&["--output", "json"])).unwrap();
    for j in got.get("jobs").items() {
        let name = j.get("name").leaf().as_str().unwrap();
        let keys = j.keys();
        if name == "tokenize" {
            assert_eq!(keys, job_keys);
        } else {
            assert_eq!(keys[..job_keys.len()], job_keys[..], "{name}");
            assert_eq!(keys[job_keys.len()..], ["kind"], "{name}");
            assert_eq!(j.get("kind").leaf(), "JobSet");
        }
    }
}

#[test]
fn simulate_the_kueue_example_runs_and_keeps_the_output_format() {
    let run = |args: &[&str]| simulate_example("kueue-scenario.yaml", args);
    let text = run(&[]);
    let row = |name: &str| -> Vec<&str> {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .split_whitespace()
            .collect()
    };
    // name, namespace, queue, cluster, submitted, admitted, started, finished, result.
    assert_eq!(row("etl-1")[3], "team-a", "{text}");
    // etl-3 waited in team-a's queue, was taken back, and ran in shared, uncounted.
    let etl3 = row("etl-3");
    assert_eq!(
        (etl3[3], etl3[4], etl3[5], etl3[8], etl3[9]),
        ("shared", "180", "360", "Succeeded", "0"),
        "{text}"
    );
    assert!(
        text.contains("jobs 6: 6 succeeded, 0 failed, 0 pending"),
        "{text}"
    );

    // The JSON has exactly the format's keys: nothing is added for Kueue workers.
    let format = simulate_output_example();
    let job_keys = format.get("jobs").items()[0].keys();
    let got: Ordered = serde_json::from_str(&run(&["--output", "json"])).unwrap();
    for j in got.get("jobs").items() {
        assert_eq!(j.keys(), job_keys);
    }
    let all = run(&["--strategy", "all"]);
    assert!(all.starts_with("FIGURE"), "{all}");
}

/// A scenario of the bundled example's clusters and queues and one Job per pod template of
/// `templates`.
fn scenario_with_templates(templates: &[serde_json::Value]) -> String {
    let bundled = std::fs::read_to_string("examples/scenario.yaml").unwrap();
    let head = &bundled[..bundled.find("\njobs:").unwrap()];
    let mut text = format!("{head}\njobs:\n");
    for (i, t) in templates.iter().enumerate() {
        text.push_str(&format!(
            "  - name: j{i}\n    queue: batch\n    submitAt: 0s\n    parallelism: 1\n    duration: 1m\n    template: {t}\n"
        ));
    }
    text
}

/// The pod template of the Job the API server sent in the admission review `fixture`.
fn job_template(fixture: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(format!("tests/fixtures/admission/{fixture}")).unwrap();
    let review: serde_json::Value = serde_json::from_str(&text).unwrap();
    review["request"]["object"]["spec"]["template"]["spec"].clone()
}

/// What `simulate` prints on stderr for `scenario`, and whether it succeeded.
fn simulate_stderr(dir: &Path, scenario: &str) -> (bool, String) {
    let path = dir.join("s.yaml");
    std::fs::write(&path, scenario).unwrap();
    let out = switchyard()
        .args(["simulate", "--output", "json", "--scenario"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A key of a pod template that a Kubernetes PodSpec does not have (a typo, or a field of a
/// newer Kubernetes) is said on stderr with its path, and the run goes on, as is a field
/// kube-scheduler places by that Switchyard's placement does not model; a real Job's
/// template, with its image, command and defaulted fields, draws no word.
#[test]
fn simulate_warns_of_pod_template_keys_kubernetes_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let real = job_template("admission-mutate-create-basic.json");
    let (ok, err) = simulate_stderr(
        dir.path(),
        &scenario_with_templates(std::slice::from_ref(&real)),
    );
    assert!(ok && err.is_empty(), "{err}");

    let newer = job_template("mutate-create-unknown-fields.json");
    let mut typo = real.clone();
    let container = typo["containers"][0].as_object_mut().unwrap();
    let resources = container.remove("resources").unwrap();
    container.insert("resorces".into(), resources);
    // Job j3's pods spread over nodes (modelled) and about another app's pods (not).
    let mut spread = real.clone();
    spread["topologySpreadConstraints"] = serde_json::json!([
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "a"}}},
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"job-name": "j3"}}}
    ]);
    // Job j4's pods keep one to a node (modelled) and away from a database's (not).
    let mut apart = real.clone();
    apart["affinity"] = serde_json::json!({"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"},
            {"labelSelector": {"matchLabels": {"job-name": "j4"}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }});
    // Job j5's pods keep together in one zone (modelled) and beside a cache's (not).
    let mut together = real.clone();
    together["affinity"] = serde_json::json!({"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "topology.kubernetes.io/zone"},
            {"labelSelector": {"matchLabels": {"job-name": "j5"}}, "topologyKey": "topology.kubernetes.io/zone"}
        ]
    }});
    let (ok, err) = simulate_stderr(
        dir.path(),
        &scenario_with_templates(&[real, newer, typo, spread, apart, together]),
    );
    assert!(ok, "{err}");
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            "warning: scenario: jobs[1].template.containers[0].futureContainerField: not a field of a Kubernetes v1.33 PodSpec; skipped",
            "warning: scenario: jobs[2].template.containers[0].resorces: not a field of a Kubernetes v1.33 PodSpec; skipped",
            // A field placement does not model is said too: the run places without it.
            "warning: scenario: jobs[3].template.topologySpreadConstraints[0]: placed without it (Switchyard's placement judges requests, NUMA zones, node selector, required node affinity, tolerations, an anti-affinity that keeps a Job's pods one to a node, a spread of them over nodes, and an affinity that keeps them together)",
            "warning: scenario: jobs[4].template.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]: placed without it (Switchyard's placement judges requests, NUMA zones, node selector, required node affinity, tolerations, an anti-affinity that keeps a Job's pods one to a node, a spread of them over nodes, and an affinity that keeps them together)",
            "warning: scenario: jobs[5].template.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]: placed without it (Switchyard's placement judges requests, NUMA zones, node selector, required node affinity, tolerations, an anti-affinity that keeps a Job's pods one to a node, a spread of them over nodes, and an affinity that keeps them together)",
        ]
    );
}

/// A template copied whole from a Job (`metadata` and `spec`) is refused, as a pod with no
/// containers, and the warnings say why: they are shown even though the checks fail.
#[test]
fn simulate_says_what_it_skipped_even_when_the_scenario_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = job_template("admission-mutate-create-basic.json");
    let whole = serde_json::json!({"metadata": {"labels": {"app": "a"}}, "spec": spec});
    let (ok, err) = simulate_stderr(dir.path(), &scenario_with_templates(&[spec, whole]));
    assert!(!ok);
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            "warning: scenario: jobs[1].template.metadata: not a field of a Kubernetes v1.33 PodSpec; skipped",
            "warning: scenario: jobs[1].template.spec: not a field of a Kubernetes v1.33 PodSpec; skipped",
            "Error: scenario: jobs[1] (j1): template: needs at least one container",
        ]
    );
}

/// A queue's settings are Switchyard's own: a key that is not one is refused with its path,
/// at the queue and inside a setting.
#[test]
fn simulate_refuses_a_queue_key_that_is_not_a_setting() {
    let dir = tempfile::tempdir().unwrap();
    let bundled = std::fs::read_to_string("examples/scenario.yaml").unwrap();
    let top = bundled.replace(
        "    placement: {strategy: LeastAllocated}\n",
        "    placement: {strategy: LeastAllocated}\n    starvatoinAfter: 0s\n",
    );
    assert_ne!(top, bundled);
    let (ok, err) = simulate_stderr(dir.path(), &top);
    assert!(!ok);
    assert!(
        err.contains("queues[0]: unknown field `starvatoinAfter`"),
        "{err}"
    );
    let nested = bundled.replacen("      enabled: true\n", "      enabeld: true\n", 1);
    assert_ne!(nested, bundled);
    let (ok, err) = simulate_stderr(dir.path(), &nested);
    assert!(!ok);
    assert_eq!(
        err.trim_end(),
        "Error: scenario: queues[0].waitForPodsReady.enabeld: unknown field"
    );
}

/// `explain` reads a Pod as kube-scheduler sends it (status, managed fields and all) without
/// a word, and warns of a key a Pod does not have; the inventory's nodes' NodeResourceTopology
/// zones too.
#[test]
fn explain_warns_of_keys_kubernetes_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        std::fs::read_to_string("tests/fixtures/extender/extender-filter-nodenames.json").unwrap();
    let args: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut pod = args["Pod"].clone();
    let explain = |pod: &serde_json::Value, inventory: &str| {
        let pod_path = dir.path().join("pod.json");
        std::fs::write(&pod_path, pod.to_string()).unwrap();
        let inv_path = dir.path().join("inventory.yaml");
        std::fs::write(&inv_path, inventory).unwrap();
        let out = switchyard()
            .args(["explain", "--inventory"])
            .arg(&inv_path)
            .arg("--pod")
            .arg(&pod_path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let inventory = std::fs::read_to_string("examples/inventory.yaml").unwrap();
    assert_eq!(explain(&pod, &inventory), "");
    pod["spec"]["nodeSelecter"] = serde_json::json!({"zone": "a"});
    let typo = inventory.replacen("type: Node", "type: Node\n              parnet: x", 1);
    assert_ne!(typo, inventory);
    let err = explain(&pod, &typo);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("warning: inventory: clusters[0].nodes[0].topology.zones[0].parnet: not a field of a NodeResourceTopology"),
        "{err}"
    );
    assert_eq!(
        lines[1],
        "warning: pod: spec.nodeSelecter: not a field of a Kubernetes v1.33 Pod; skipped"
    );
}

/// `explain` judges a Job as its pod template, a cluster for the gang of the pods that run at
/// once; a kind whose spec is not a pod's is refused (read as a pod's, it would fit anywhere).
#[test]
fn explain_judges_a_job_as_the_gang_of_its_pods() {
    let dir = tempfile::tempdir().unwrap();
    let review: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("tests/fixtures/admission/admission-mutate-create-basic.json")
            .unwrap(),
    )
    .unwrap();
    let mut job = review["request"]["object"].clone();
    assert_eq!(
        (
            job["spec"]["parallelism"].as_i64(),
            job["spec"]["completions"].as_i64()
        ),
        (Some(2), Some(4))
    );
    let run = |manifest: &serde_json::Value| {
        let path = dir.path().join("workload.json");
        std::fs::write(&path, manifest.to_string()).unwrap();
        switchyard()
            .args([
                "explain",
                "--inventory",
                "examples/inventory.yaml",
                "--cluster",
                "eu-1",
                "--pod",
            ])
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = run(&job);
    assert!(out.status.success(), "{out:?}");
    // The Job as the API server sent it (managed fields and all) draws no warning.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.starts_with("pod research/basic ("), "{report}");
    assert!(report.contains("gang of 2;"), "{report}");
    assert!(report.contains("cluster eu-1: 2 pod(s) fit on"), "{report}");
    job["spec"]["completions"] = 1.into();
    let report = String::from_utf8_lossy(&run(&job).stdout).into_owned();
    assert!(report.contains("gang of 1;"), "{report}");
    // A key a Job does not have is named, as in a Pod.
    let container = job["spec"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap();
    let resources = container.remove("resources").unwrap();
    container.insert("resorces".into(), resources);
    let out = run(&job);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "warning: pod: spec.template.spec.containers[0].resorces: not a field of a Kubernetes v1.33 Job; skipped\n"
    );
    // Pods that keep one to a node need a node each: eu-1 has one that takes them. A term
    // placement does not model (away from a database's pods) is named.
    let container = job["spec"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap();
    let resources = container.remove("resorces").unwrap();
    container.insert("resources".into(), resources);
    job["spec"]["template"]["spec"]["affinity"] = serde_json::json!({"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "basic"}}, "topologyKey": "kubernetes.io/hostname"},
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }});
    let out = run(&job);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "warning: pod: spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[1]: placed without it (Switchyard's placement judges requests, NUMA zones, node selector, required node affinity, tolerations, an anti-affinity that keeps a Job's pods one to a node, a spread of them over nodes, and an affinity that keeps them together)\n"
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("gang of 1, one pod to a node (its required pod anti-affinity);"),
        "{report}"
    );
    job["spec"]["completions"] = 2.into();
    let report = String::from_utf8_lossy(&run(&job).stdout).into_owned();
    assert!(
        report.contains("cluster eu-1: does not fit: only 1 of 2 pods fit at once"),
        "{report}"
    );
    // Pods that spread over nodes: eu-1's GPU node counts for the spread (its taint keeps
    // them off, but the constraint's nodeTaintsPolicy is Ignore), with none, so its other
    // node may take one.
    let spec = job["spec"]["template"]["spec"].as_object_mut().unwrap();
    spec.remove("affinity");
    spec.insert(
        "topologySpreadConstraints".into(),
        serde_json::json!([{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "basic"}}
        }]),
    );
    let out = run(&job);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(
            "gang of 2, spread over nodes at most 1 apart (its topology spread constraint);"
        ),
        "{report}"
    );
    assert!(
        report.contains("cluster eu-1: does not fit: only 1 of 2 pods fit at once in cluster eu-1; then: its pods spread over nodes (a topology spread constraint on kubernetes.io/hostname, maxSkew 1): node eu-1-gpu-a of cluster eu-1 takes 0 of them, so no node may take more than 1\n"),
        "{report}"
    );
    // Pods kept together in one zone: the bundled inventory's nodes have no zone label.
    let spec = job["spec"]["template"]["spec"].as_object_mut().unwrap();
    spec.remove("topologySpreadConstraints");
    spec.insert(
        "affinity".into(),
        serde_json::json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "basic"}},
            "topologyKey": "topology.kubernetes.io/zone"
        }]}}),
    );
    let out = run(&job);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(
            "gang of 2, kept together in one topology.kubernetes.io/zone (its required pod affinity);"
        ),
        "{report}"
    );
    assert!(
        report.contains("cluster eu-1: does not fit: only 0 of 2 pods fit at once in cluster eu-1; then: its pods keep together in one topology.kubernetes.io/zone (a required pod affinity to one another), and no node of cluster eu-1 has the label topology.kubernetes.io/zone\n"),
        "{report}"
    );
    assert!(
        report.contains("    note: node eu-1-cpu-a has no label topology.kubernetes.io/zone, by which its pods keep together: kube-scheduler binds none of them here\n"),
        "{report}"
    );
    job["kind"] = "Deployment".into();
    job["apiVersion"] = "apps/v1".into();
    let out = run(&job);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("workload.json is a Deployment: explain judges a Pod, a batch/v1 Job or"),
        "{err}"
    );
}

/// A JobSet whose replicated Jobs ask for different pods is judged as the dispatcher places
/// it: every pod in one cluster, the part of the most pods first, then the others on what it
/// leaves; each shape's pods are named by their replicated Jobs, and judged node by node.
#[test]
fn explain_judges_a_jobset_of_several_pod_shapes_as_one_gang() {
    let run = |pod: &str, cluster: &str| {
        stdout_of(switchyard().args([
            "explain",
            "--inventory",
            "examples/inventory.yaml",
            "--pod",
            pod,
            "--cluster",
            cluster,
        ]))
    };
    // The bundled JobSet: a CPU driver beside four GPU workers.
    let report = run("examples/jobset.yaml", "us-1");
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "jobset research/trainer, gang of 5 in 2 pod shapes placed in one cluster; * marks a preferred hint",
            "  replicated Job workers: 4 pod(s), Guaranteed QoS",
            "  replicated Job driver: 1 pod(s), Guaranteed QoS",
            "cluster us-1: 5 pod(s) fit: replicated Job workers on us-1-gpu-a×4; replicated Job driver on us-1-gpu-a×1; score (LeastAllocated) 8 of 10",
        ],
        "{report}"
    );
    // Each shape is judged on each node, under its own heading: the driver asks for no GPU.
    let workers = report.find(
        "  replicated Job workers, a pod on each node as it is:\n    node us-1-gpu-a: fits\n",
    );
    let driver = report
        .find("  replicated Job driver, a pod on each node as it is:\n    node us-1-gpu-a: fits\n");
    assert!(workers.is_some() && driver > workers, "{report}");
    assert!(
        report[driver.unwrap()..]
            .lines()
            .all(|l| !l.contains("nvidia.com/gpu")),
        "{report}"
    );
    // In eu-1 the workers do not tolerate the GPU node's taint: the part is named.
    let report = run("examples/jobset.yaml", "eu-1");
    assert!(
        report.contains("cluster eu-1: does not fit: replicated Job workers: only 0 of 4 pods fit at once in cluster eu-1; then: node eu-1-gpu-a has taint nvidia.com/gpu=present:NoSchedule that the pod does not tolerate\n"),
        "{report}"
    );
    // A driver that fits the empty node alone (90 of its 96 CPUs) but not beside the workers'
    // 8: the gang does not fit, and the report says beside what.
    let dir = tempfile::tempdir().unwrap();
    let mut jobset: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string("examples/jobset.yaml").unwrap()).unwrap();
    let driver = &mut jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        ["containers"][0]["resources"];
    *driver = serde_yaml::from_str("{requests: {cpu: \"90\", memory: 1Gi}}").unwrap();
    let path = dir.path().join("jobset.yaml");
    std::fs::write(&path, serde_yaml::to_string(&jobset).unwrap()).unwrap();
    let report = run(path.to_str().unwrap(), "us-1");
    assert!(
        report.contains("  replicated Job driver: 1 pod(s), not Guaranteed: CPU and memory are not NUMA-aligned\n"),
        "{report}"
    );
    assert!(
        report.contains("cluster us-1: does not fit: replicated Job driver, beside the pods of replicated Job workers: needs 90 cpu on one node; node us-1-gpu-a has 88 free of 96 allocatable\n"),
        "{report}"
    );
    let alone = report
        .split("  replicated Job driver, a pod on each node as it is:\n")
        .nth(1);
    assert!(
        alone.is_some_and(|a| a.starts_with("    node us-1-gpu-a: fits\n")),
        "{report}"
    );
    // `--node`: one pod of each shape on the node.
    let report = stdout_of(switchyard().args([
        "explain",
        "--inventory",
        "examples/inventory.yaml",
        "--pod",
        "examples/jobset.yaml",
        "--node",
        "eu-1-cpu-a",
    ]));
    assert!(
        report.contains("cluster eu-1:\n  replicated Job workers, a pod on each node as it is:\n    node eu-1-cpu-a: does not fit (unresolvable): needs 1 nvidia.com/gpu; node eu-1-cpu-a has none\n"),
        "{report}"
    );
    assert!(
        report.contains(
            "  replicated Job driver, a pod on each node as it is:\n    node eu-1-cpu-a: fits\n"
        ),
        "{report}"
    );
}

/// `serve --standalone --inventory FILE` logs a warning for each key of the file's Kubernetes
/// shapes that the shape does not have (a zone's `parnet`), and serves.
#[test]
fn serve_logs_the_inventory_keys_kubernetes_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = std::fs::read_to_string("examples/inventory.yaml").unwrap();
    let typo = inventory.replacen("type: Node", "type: Node\n              parnet: x", 1);
    assert_ne!(typo, inventory);
    std::fs::write(dir.path().join("inventory.yaml"), typo).unwrap();
    let mut child = spawn_serve(
        &[
            "--standalone",
            "--dev-tls",
            "pki",
            "--inventory",
            "inventory.yaml",
        ],
        dir.path(),
        &[],
    );
    let logged = wait_serving(&mut child);
    sigterm(&child);
    assert_eq!(exit_code(&mut child), Some(0));
    let warnings: Vec<serde_json::Value> = (logged.iter())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "WARN" && v["inventory"] == "inventory.yaml")
        .collect();
    assert_eq!(warnings.len(), 1, "{logged:#?}");
    assert!(
        warnings[0]["message"].as_str().unwrap().starts_with(
            "clusters[0].nodes[0].topology.zones[0].parnet: not a field of a NodeResourceTopology"
        ),
        "{warnings:?}"
    );
}
