//! The Helm chart in charts/switchyard, rendered and linted by Helm's own Go SDK (the
//! helm-python-sdk package, through tests/chart/render.py) and checked against the code: the
//! paths and ports the server really serves, the flags it really parses, the extender verbs,
//! the CRDs, and the API calls listed in `switchyard::rbac`.
//!
//! Helm comes from `SWITCHYARD_HELM_PYTHON` (a Python with helm-python-sdk; `.ci/run` makes
//! one), else `python3`. Without it these tests print one skip line and pass, unless
//! `SWITCHYARD_REQUIRE_HELM=1`, which makes a missing Helm a failure. The CRD and version
//! checks need no Helm and always run.

mod common;

use clap::Parser;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use switchyard::cli::{Cli, Command as Sub, ServeArgs};
use switchyard::config::{FileConfig, ServeSettings, TlsSource};
use switchyard::rbac::{self, Feature, Role, Scope};
use switchyard::wellknown;

const RELEASE: &str = "switchyard";
const NAMESPACE: &str = "switchyard-system";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn chart_dir() -> PathBuf {
    repo("charts/switchyard")
}

// ---------------------------------------------------------------------------------------
// Helm through Python

struct Helm {
    python: String,
}

/// The Helm to render with, or `None` (after one skip line) when there is none and none is
/// required.
fn helm() -> Option<&'static Helm> {
    static HELM: OnceLock<Option<Helm>> = OnceLock::new();
    HELM.get_or_init(|| {
        let configured = std::env::var("SWITCHYARD_HELM_PYTHON").ok();
        let required = std::env::var("SWITCHYARD_REQUIRE_HELM").is_ok_and(|v| v == "1");
        let python = configured.clone().unwrap_or_else(|| "python3".into());
        let check = Command::new(&python)
            .arg(repo("tests/chart/render.py"))
            .arg("check")
            .output();
        match check {
            Ok(out) if out.status.success() => Some(Helm { python }),
            other => {
                let why = match other {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
                    Err(e) => format!("{python}: {e}"),
                };
                assert!(
                    !required,
                    "SWITCHYARD_REQUIRE_HELM=1 but Helm is not usable ({why}); run .ci/run, or set SWITCHYARD_HELM_PYTHON to a Python with helm-python-sdk installed"
                );
                // Straight to stderr: the test harness captures eprintln! of passing tests.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "chart: skipped: no Helm ({why}); pip install helm-python-sdk, or set SWITCHYARD_HELM_PYTHON"
                );
                None
            }
        }
    })
    .as_ref()
}

/// Runs render.py; `Err` is Helm's own refusal (bad values, a failing template).
fn run_helm(helm: &Helm, args: &[&str], values: &Value) -> Result<Value, String> {
    let mut child = Command::new(&helm.python)
        .arg(repo("tests/chart/render.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(values.to_string().as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "render.py {args:?} printed no JSON ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    match out.status.code() {
        Some(0) => Ok(stdout),
        Some(2) => Err(stdout["error"].as_str().unwrap_or_default().to_string()),
        _ => panic!(
            "render.py {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// One YAML document of the output, parsed and as text (for the comments).
struct Doc {
    value: Value,
    text: String,
}

struct Rendered {
    docs: Vec<Doc>,
    notes: String,
}

fn try_render(values: Value) -> Option<Result<Rendered, String>> {
    try_render_on(values, &[])
}

/// [`try_render`] for a cluster that serves these API versions besides the built-in ones
/// (`helm template --api-versions`): `group/version`, or `group/version/Kind`.
fn try_render_on(values: Value, api_versions: &[&str]) -> Option<Result<Rendered, String>> {
    let helm = helm()?;
    let chart = chart_dir();
    let mut args = vec!["template", chart.to_str().unwrap(), RELEASE, NAMESPACE];
    let api_versions = api_versions.join(",");
    if !api_versions.is_empty() {
        args.extend(["--api-versions", &api_versions]);
    }
    Some(run_helm(helm, &args, &values).map(|out| {
        let mut docs = Vec::new();
        let mut notes = String::new();
        for (path, text) in out["manifests"].as_object().unwrap() {
            let text = text.as_str().unwrap();
            if path.ends_with("NOTES.txt") {
                notes = text.to_string();
                continue;
            }
            for chunk in split_documents(text) {
                let value: Value = serde_yaml::from_str(&chunk)
                    .unwrap_or_else(|e| panic!("{path} is not YAML: {e}\n{chunk}"));
                if !value.is_null() {
                    docs.push(Doc { value, text: chunk });
                }
            }
        }
        Rendered { docs, notes }
    }))
}

fn split_documents(text: &str) -> Vec<String> {
    let mut chunks = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            chunks.push(String::new());
        } else {
            let last = chunks.last_mut().unwrap();
            last.push_str(line);
            last.push('\n');
        }
    }
    chunks
}

/// Renders with these values (merged over the chart's defaults by Helm), or `None` when the
/// tests run without Helm.
fn render(values: Value) -> Option<Rendered> {
    render_on(values, &[])
}

/// [`render`] for a cluster that serves these API versions (see [`try_render_on`]).
fn render_on(values: Value, api_versions: &[&str]) -> Option<Rendered> {
    try_render_on(values.clone(), api_versions).map(|r| {
        r.unwrap_or_else(|e| {
            panic!("the chart does not render with {values} on {api_versions:?}: {e}")
        })
    })
}

/// Helm's refusal of these values.
fn refusal(values: Value) -> Option<String> {
    try_render(values.clone()).map(|r| match r {
        Ok(_) => panic!("the chart renders with {values}, which it must refuse"),
        Err(e) => e,
    })
}

impl Rendered {
    fn all(&self, kind: &str) -> Vec<&Doc> {
        self.docs
            .iter()
            .filter(|d| d.value["kind"] == kind)
            .collect()
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        &self.doc(kind, name).value
    }

    fn doc(&self, kind: &str, name: &str) -> &Doc {
        self.docs
            .iter()
            .find(|d| d.value["kind"] == kind && d.value["metadata"]["name"] == name)
            .unwrap_or_else(|| {
                let have: Vec<String> = self
                    .docs
                    .iter()
                    .map(|d| format!("{}/{}", d.value["kind"], d.value["metadata"]["name"]))
                    .collect();
                panic!("no {kind} {name}; rendered: {have:?}")
            })
    }

    fn has(&self, kind: &str) -> bool {
        !self.all(kind).is_empty()
    }

    fn deployment(&self) -> &Value {
        self.get("Deployment", RELEASE)
    }

    fn container(&self) -> &Value {
        &self.deployment()["spec"]["template"]["spec"]["containers"][0]
    }

    /// The switchyard container's args parsed by the real command line.
    fn serve_args(&self) -> ServeArgs {
        let args: Vec<String> = self.container()["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let cli = Cli::try_parse_from(std::iter::once("switchyard".to_string()).chain(args))
            .unwrap_or_else(|e| panic!("the chart's args do not parse: {e}"));
        match cli.command {
            Sub::Serve(args) => *args,
            other => panic!("the container runs {other:?}, not serve"),
        }
    }

    /// The config file of the ConfigMap, as YAML.
    fn config(&self) -> serde_yaml::Mapping {
        let cm = self.get("ConfigMap", &format!("{RELEASE}-config"));
        serde_yaml::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap()
    }

    /// Args and config file resolved by the server's own code, as `serve` would.
    fn settings(&self) -> ServeSettings {
        let file = parse_config_file(self.config());
        ServeSettings::resolve(&self.serve_args(), file)
            .unwrap_or_else(|e| panic!("serve refuses the chart's settings: {e}"))
    }

    /// The mount path of the switchyard container's volume `name`.
    fn mount(&self, name: &str) -> &Value {
        self.container()["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no volume mount {name}"))
    }

    fn volume(&self, name: &str) -> &Value {
        self.deployment()["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
    }

    fn container_port(&self, name: &str) -> u16 {
        self.container()["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port {name}")) as u16
    }
}

fn parse_config_file(map: serde_yaml::Mapping) -> FileConfig {
    let text = serde_yaml::to_string(&map).unwrap();
    FileConfig::parse(&text)
        .unwrap_or_else(|e| panic!("serve refuses the chart's config file: {e}\n{text}"))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

// ---------------------------------------------------------------------------------------
// Without Helm

#[test]
fn the_chart_crds_are_switchyard_crds() {
    let path = "charts/switchyard/crds/switchyard.dev.yaml";
    let in_chart = std::fs::read_to_string(repo(path)).unwrap();
    assert!(
        in_chart == switchyard::api::crds_yaml(),
        "the CRDs changed: regenerate {path} with\n    cargo run -q -- crds > {path}"
    );
    let files: Vec<_> = std::fs::read_dir(repo("charts/switchyard/crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 1, "only {path} in crds/: {files:?}");
}

#[test]
fn chart_versions_ports_and_patterns_follow_the_code() {
    let chart: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(
        chart["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "Chart.yaml appVersion is the default image tag: keep it at Cargo.toml's version"
    );
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
            .unwrap();
    assert_eq!(
        values["ports"]["https"],
        switchyard::config::DEFAULT_HTTPS_PORT
    );
    assert_eq!(
        values["ports"]["http"],
        switchyard::config::DEFAULT_PROBE_PORT
    );
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        schema["definitions"]["duration"]["pattern"],
        switchyard::api::DURATION_PATTERN,
        "durations in values are checked as the server parses them"
    );
    assert_eq!(
        schema["definitions"]["dnsSubdomain"]["pattern"],
        switchyard::api::DNS1123_SUBDOMAIN_PATTERN
    );
}

#[test]
fn the_image_is_the_binary_alone_as_non_root() {
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let cargo: Value = toml_value(
        &std::fs::read_to_string(repo("Cargo.toml")).unwrap(),
        "rust-version",
    );
    let pinned = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG RUST_VERSION="))
        .expect("ARG RUST_VERSION=");
    let version = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    assert!(
        version(pinned) >= version(s(&cargo)),
        "the builder's Rust {pinned} is older than Cargo.toml's rust-version {cargo}"
    );
    assert!(dockerfile.contains("cargo build --release --locked"));
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    assert!(runtime.starts_with("gcr.io/distroless/"), "{runtime}");
    let copies: Vec<&str> = runtime.lines().filter(|l| l.starts_with("COPY")).collect();
    assert_eq!(
        copies,
        ["COPY --from=build /switchyard /switchyard"],
        "only the binary"
    );
    assert!(runtime.lines().any(|l| l == "USER nonroot:nonroot"));
    assert!(runtime
        .lines()
        .any(|l| l == r#"ENTRYPOINT ["/switchyard"]"#));
    // The chart relies on that entrypoint: it gives only the arguments.
    if let Some(r) = render(json!({})) {
        assert!(r.container().get("command").is_none());
        assert_eq!(r.container()["args"][0], "serve");
    }
}

/// `docker build` sees only what `.dockerignore` lets in and the builder stage copies: every
/// file the binary embeds (`include_str!` outside test code) must be both, or the image does
/// not build.
#[test]
fn the_image_build_context_holds_every_file_the_binary_embeds() {
    let ignore = std::fs::read_to_string(repo(".dockerignore")).unwrap();
    let allowed: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .collect();
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let builder = dockerfile.split("\nFROM ").nth(1).expect("a builder stage");
    let copied: Vec<&str> = builder
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words[..words.len() - 1].to_vec()
        })
        .collect();
    let covers = |patterns: &[&str], file: &str| {
        patterns.iter().any(|p| {
            let p = p.trim_end_matches('/');
            file == p || file.starts_with(&format!("{p}/"))
        })
    };
    let mut embedded = Vec::new();
    let mut stack = vec![repo("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Test modules sit at the end of a file, after `#[cfg(test)]`.
            let shipped = text.split("#[cfg(test)]").next().unwrap();
            for part in shipped.split("include_str!(").skip(1) {
                let literal = part.trim_start().trim_start_matches('"');
                let relative = &literal[..literal.find('"').unwrap()];
                let file = path.parent().unwrap().join(relative);
                let file = std::fs::canonicalize(&file)
                    .unwrap_or_else(|e| panic!("{}: {}: {e}", path.display(), relative));
                let root = std::fs::canonicalize(repo("")).unwrap();
                let file = file
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                embedded.push(file);
            }
        }
    }
    assert!(
        embedded.iter().any(|f| f == "examples/scenario.yaml"),
        "the scan finds the bundled scenario: {embedded:?}"
    );
    for file in &embedded {
        assert!(
            covers(&allowed, file),
            "{file} is embedded by src/ but .dockerignore keeps it out of the build context"
        );
        assert!(
            covers(&copied, file),
            "{file} is embedded by src/ but the Dockerfile's builder stage does not COPY it"
        );
    }
}

/// One top-level `key = "value"` of a TOML file (enough for Cargo.toml's package keys).
fn toml_value(text: &str, key: &str) -> Value {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| json!(v.trim().trim_matches('"')))
        })
        .unwrap_or_else(|| panic!("no {key} in Cargo.toml"))
}

// ---------------------------------------------------------------------------------------
// Lint

#[test]
fn helm_lint_is_clean_for_each_role_and_option() {
    let Some(helm) = helm() else { return };
    let ca = base64_ca();
    for values in [
        json!({}),
        json!({"role": "worker"}),
        json!({"role": "worker", "scheduler": {"enabled": true}}),
        json!({"scheduler": {"enabled": true, "extender": {"bind": true}}, "metrics": {"serviceMonitor": {"enabled": true}}}),
        json!({"certManager": {"enabled": false}, "tls": {"secretName": "mine", "caBundle": ca}, "scheduler": {"enabled": true}}),
        json!({"certManager": {"issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"}}}),
        json!({"jobset": {"enabled": true}}),
        json!({"role": "worker", "jobset": {"enabled": true}}),
    ] {
        let report = run_helm(
            helm,
            &["lint", chart_dir().to_str().unwrap(), NAMESPACE],
            &values,
        )
        .unwrap_or_else(|e| panic!("lint could not run with {values}: {e}"));
        let serious: Vec<&Value> = report["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["severity"].as_u64().unwrap_or(3) >= 2)
            .collect();
        assert!(
            serious.is_empty(),
            "helm lint --strict with {values}: {serious:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Webhooks

fn base64_ca() -> String {
    use base64::Engine;
    let generated =
        switchyard::certs::generate(&["switchyard-webhook.switchyard-system.svc".into()], &[])
            .unwrap();
    base64::engine::general_purpose::STANDARD.encode(generated.ca_cert_pem)
}

fn webhooks(r: &Rendered) -> Vec<(&str, &Value, &Value)> {
    let mut out = Vec::new();
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        for doc in r.all(kind) {
            for hook in doc.value["webhooks"].as_array().unwrap() {
                out.push((kind, &doc.value, hook));
            }
        }
    }
    out
}

#[test]
fn webhooks_call_the_paths_the_server_serves_through_the_service() {
    let Some(r) = render(json!({})) else { return };
    let hooks = webhooks(&r);
    assert_eq!(hooks.len(), 2);
    let service = r.get("Service", &format!("{RELEASE}-webhook"));
    let serving = format!("{RELEASE}-serving");
    let mut paths = BTreeSet::new();
    for (kind, config, hook) in &hooks {
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{NAMESPACE}/{serving}"),
            "{kind}: cainjector fills caBundle from the serving Certificate"
        );
        assert!(hook["clientConfig"].get("caBundle").is_none(), "{kind}");
        let svc = &hook["clientConfig"]["service"];
        assert_eq!(svc["name"], service["metadata"]["name"]);
        assert_eq!(svc["namespace"], NAMESPACE);
        assert_eq!(svc["port"], service["spec"]["ports"][0]["port"]);
        assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["timeoutSeconds"], 5);
        let rule = &hook["rules"][0];
        assert_eq!(
            (&rule["apiGroups"], &rule["apiVersions"], &rule["resources"]),
            (&json!(["batch"]), &json!(["v1"]), &json!(["jobs"]))
        );
        let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(excluded["key"], wellknown::NAMESPACE_NAME_LABEL);
        assert_eq!(excluded["operator"], "NotIn");
        assert_eq!(excluded["values"], json!([NAMESPACE, "kube-system"]));
        paths.insert(s(&svc["path"]).to_string());
    }
    // The Certificate cainjector reads exists and is the one the server mounts.
    let cert = r.get("Certificate", &serving);
    assert_eq!(
        cert["spec"]["secretName"],
        r.volume("tls")["secret"]["secretName"]
    );
    assert_eq!(
        paths,
        BTreeSet::from([
            wellknown::MUTATE_JOB_PATH.to_string(),
            wellknown::VALIDATE_JOB_PATH.to_string()
        ])
    );
    let (_, _, mutating) = hooks[0];
    assert_eq!(
        mutating["clientConfig"]["service"]["path"],
        wellknown::MUTATE_JOB_PATH
    );
    assert_eq!(mutating["rules"][0]["operations"], json!(["CREATE"]));
    assert_eq!(mutating["reinvocationPolicy"], "Never");
    assert_eq!(
        mutating["objectSelector"]["matchExpressions"][0],
        json!({"key": wellknown::QUEUE_LABEL, "operator": "Exists"})
    );
    let (_, _, validating) = hooks[1];
    assert_eq!(
        validating["rules"][0]["operations"],
        json!(["CREATE", "UPDATE"])
    );
    assert!(validating.get("objectSelector").is_none());

    // The server built from the chart's own settings answers a real review on each path.
    live_server(&r, |mut conn| async move {
        for path in &paths {
            let body = common::fixture("admission-mutate-create-basic");
            let (status, reply) = conn.post_json(path, body).await;
            assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&reply));
            let reply: Value = serde_json::from_slice(&reply).unwrap();
            assert_eq!(reply["kind"], "AdmissionReview", "{path}");
        }
    });
}

#[test]
fn webhook_settings_come_from_values() {
    let Some(r) = render(json!({"webhooks": {
        "failurePolicy": "Ignore",
        "timeoutSeconds": 12,
        "namespaceSelector": {
            "matchLabels": {"switchyard.dev/managed": "true"},
            "matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]
        },
        "mutating": {"reinvocationPolicy": "IfNeeded", "objectSelector": {"matchLabels": {"batch": "yes"}}},
        "validating": {"objectSelector": {"matchLabels": {"batch": "yes"}}}
    }})) else {
        return;
    };
    for (kind, _, hook) in webhooks(&r) {
        assert_eq!(hook["failurePolicy"], "Ignore", "{kind}");
        assert_eq!(hook["timeoutSeconds"], 12, "{kind}");
        let ns = &hook["namespaceSelector"];
        assert_eq!(
            ns["matchLabels"],
            json!({"switchyard.dev/managed": "true"}),
            "{kind}"
        );
        let expressions = ns["matchExpressions"].as_array().unwrap();
        assert_eq!(
            expressions.len(),
            2,
            "{kind}: the exclusion stays, the user's is added"
        );
        assert_eq!(expressions[0]["values"], json!([NAMESPACE, "kube-system"]));
        assert_eq!(expressions[1]["key"], "team");
        assert_eq!(
            hook["objectSelector"],
            json!({"matchLabels": {"batch": "yes"}}),
            "{kind}"
        );
    }
    let mutating = r.get(
        "MutatingWebhookConfiguration",
        &format!("{RELEASE}-mutating"),
    );
    assert_eq!(mutating["webhooks"][0]["reinvocationPolicy"], "IfNeeded");

    // A default queue needs unlabelled Jobs to reach the mutating hook.
    let Some(r) = render(json!({"config": {"defaultQueue": "research", "managedNamespaces": {}}}))
    else {
        return;
    };
    let mutating = r.get(
        "MutatingWebhookConfiguration",
        &format!("{RELEASE}-mutating"),
    );
    assert!(mutating["webhooks"][0].get("objectSelector").is_none());
    let settings = r.settings();
    assert_eq!(settings.policy.default_queue.as_deref(), Some("research"));
    assert!(settings.policy.managed_namespaces.is_some());
}

// ---------------------------------------------------------------------------------------
// Deployment, Service, probes, configuration

#[test]
fn service_ports_and_probes_match_what_the_server_listens_on() {
    for ports in [json!({}), json!({"ports": {"https": 10443, "http": 9090}})] {
        let mut values = ports.clone();
        values["metrics"] = json!({"serviceMonitor": {"enabled": true}});
        let Some(r) = render(values) else { return };
        let settings = r.settings();
        let https = r.container_port("https");
        let http = r.container_port("http");
        assert_eq!(settings.listen.port(), https, "{ports}");
        assert_eq!(settings.probe_listen.port(), http, "{ports}");
        assert!(
            settings.listen.ip().is_unspecified() && settings.probe_listen.ip().is_unspecified()
        );

        let service = r.get("Service", &format!("{RELEASE}-webhook"));
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
        assert_eq!(service["spec"]["ports"][0]["port"], 443);
        let pod_labels = &r.deployment()["spec"]["template"]["metadata"]["labels"];
        for (k, v) in service["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&pod_labels[k], v, "the Service selects the pods");
        }
        let metrics = r.get("Service", &format!("{RELEASE}-metrics"));
        assert_eq!(metrics["spec"]["ports"][0]["targetPort"], "http");

        let c = r.container();
        assert_eq!(
            c["livenessProbe"]["httpGet"]["path"],
            wellknown::HEALTHZ_PATH
        );
        assert_eq!(c["livenessProbe"]["httpGet"]["port"], "http");
        assert_eq!(
            c["readinessProbe"]["httpGet"]["path"],
            wellknown::READYZ_PATH
        );
        assert_eq!(c["readinessProbe"]["httpGet"]["port"], "http");

        let monitor = r.get("ServiceMonitor", RELEASE);
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(endpoint["path"], wellknown::METRICS_PATH);
        assert_eq!(endpoint["port"], metrics["spec"]["ports"][0]["name"]);
        for (k, v) in monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
        {
            assert_eq!(
                &metrics["metadata"]["labels"][k], v,
                "the ServiceMonitor selects the metrics Service"
            );
        }
        let scrapes_https = monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| service["metadata"]["labels"][k] == *v);
        assert!(
            !scrapes_https,
            "the ServiceMonitor also selects the HTTPS Service"
        );
    }
}

#[test]
fn probes_answer_on_the_paths_the_chart_uses() {
    for role in ["manager", "worker"] {
        let Some(r) = render(json!({"role": role})) else {
            return;
        };
        // live_server GETs every probe path of the pod, and /metrics, on the probe port.
        live_server(&r, |_conn| async {});
    }
}

#[test]
fn files_and_identity_of_the_server() {
    let Some(r) = render(
        json!({"config": {"extraDispatcherUsernames": ["system:serviceaccount:ops:rescuer"]}}),
    ) else {
        return;
    };
    let settings = r.settings();
    // The certificate is read from the Secret, mounted whole (never subPath: renewals).
    match &settings.tls {
        TlsSource::Files { cert, key } => {
            let dir = s(&r.mount("tls")["mountPath"]);
            assert_eq!(cert, &Path::new(dir).join("tls.crt"));
            assert_eq!(key, &Path::new(dir).join("tls.key"));
        }
        other => panic!("the chart must use the serving Secret, not {other:?}"),
    }
    for m in r.container()["volumeMounts"].as_array().unwrap() {
        assert!(
            m.get("subPath").is_none(),
            "{m}: subPath mounts never see renewals"
        );
        assert_eq!(m["readOnly"], true, "{m}");
    }
    let config_arg = r.serve_args().config.unwrap();
    assert_eq!(
        config_arg.parent().unwrap(),
        Path::new(s(&r.mount("config")["mountPath"]))
    );
    assert_eq!(
        r.volume("config")["configMap"]["name"],
        format!("{RELEASE}-config")
    );
    // Only the chart's ServiceAccount (and the extra user) may unsuspend.
    let sa = s(&r.deployment()["spec"]["template"]["spec"]["serviceAccountName"]);
    assert_eq!(
        settings.policy.dispatcher_usernames,
        vec![
            format!("system:serviceaccount:{NAMESPACE}:{sa}"),
            "system:serviceaccount:ops:rescuer".to_string()
        ]
    );
    assert_eq!(
        settings.policy.dispatcher_usernames[0],
        wellknown::DEFAULT_DISPATCHER_USERNAME
    );
    // The settings other branches add, by their names.
    let config = r.config();
    let get = |k: &str| config.get(k).cloned().unwrap_or(serde_yaml::Value::Null);
    assert_eq!(get("role"), "manager");
    assert_eq!(get("namespace"), NAMESPACE);
    assert_eq!(get("virtualNodes"), true);
    assert_eq!(get("managerId"), "switchyard");
    assert_eq!(get("leaderElection")["enabled"], true);
    assert_eq!(get("leaderElection")["leaseName"], "switchyard-leader");
    let env = r.container()["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "POD_NAMESPACE"
        && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"));
}

#[test]
fn deployment_is_hardened_and_highly_available() {
    let Some(r) = render(json!({})) else { return };
    let d = r.deployment();
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(
        s(&r.container()["image"]),
        format!("switchyard:{}", env!("CARGO_PKG_VERSION"))
    );
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &r.container()["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(r.container()["resources"]["requests"]["cpu"].is_string());
    assert!(r.container()["resources"]["limits"]["memory"].is_string());
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    let spread = pod["topologySpreadConstraints"].as_array().unwrap();
    assert!(!spread.is_empty());
    for c in spread {
        for (k, v) in c["labelSelector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&labels[k], v, "{c}");
        }
    }
    // Graceful shutdown fits in the grace period.
    let settings = r.settings();
    assert!(
        pod["terminationGracePeriodSeconds"].as_u64().unwrap()
            > settings.shutdown_timeout.as_secs()
    );
    let pdb = r.get("PodDisruptionBudget", RELEASE);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    for (k, v) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[k], v);
    }
    assert!(d["spec"]["template"]["metadata"]["annotations"]["checksum/config"].is_string());
}

// ---------------------------------------------------------------------------------------
// Certificates

#[test]
fn cert_manager_issues_a_stable_ca_and_a_short_lived_serving_certificate() {
    let Some(r) = render(json!({})) else { return };
    let svc = format!("{RELEASE}-webhook");
    let selfsigned = r.get("Issuer", &format!("{RELEASE}-selfsigned"));
    assert!(selfsigned["spec"]["selfSigned"].is_object());
    let ca = r.get("Certificate", &format!("{RELEASE}-ca"));
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(
        ca["spec"]["issuerRef"]["name"],
        selfsigned["metadata"]["name"]
    );
    let ca_issuer = r.get("Issuer", &format!("{RELEASE}-ca"));
    assert_eq!(
        ca_issuer["spec"]["ca"]["secretName"],
        ca["spec"]["secretName"]
    );
    let serving = r.get("Certificate", &format!("{RELEASE}-serving"));
    assert_eq!(
        serving["spec"]["issuerRef"]["name"],
        ca_issuer["metadata"]["name"]
    );
    assert_eq!(serving["spec"]["issuerRef"]["kind"], "Issuer");
    let names = serving["spec"]["dnsNames"].as_array().unwrap();
    for name in [
        format!("{svc}.{NAMESPACE}.svc"),
        format!("{svc}.{NAMESPACE}.svc.cluster.local"),
    ] {
        assert!(names.contains(&json!(name)), "{name} in {names:?}");
    }
    let hours = |v: &Value| switchyard::config::parse_duration(s(v)).unwrap().as_secs() / 3600;
    assert!(hours(&serving["spec"]["duration"]) * 10 <= hours(&ca["spec"]["duration"]));
    assert!(hours(&serving["spec"]["renewBefore"]) < hours(&serving["spec"]["duration"]));
    assert_ne!(ca["spec"]["secretName"], serving["spec"]["secretName"]);

    // The user's issuer instead.
    let Some(r) = render(
        json!({"certManager": {"issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"}}}),
    ) else {
        return;
    };
    assert!(!r.has("Issuer"));
    assert_eq!(r.all("Certificate").len(), 1);
    let serving = r.get("Certificate", &format!("{RELEASE}-serving"));
    assert_eq!(
        serving["spec"]["issuerRef"],
        json!({"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"})
    );
    for (_, config, _) in webhooks(&r) {
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{NAMESPACE}/{RELEASE}-serving")
        );
    }
}

#[test]
fn without_cert_manager_the_users_secret_and_ca_bundle_are_used() {
    let ca = base64_ca();
    let Some(r) = render(json!({
        "certManager": {"enabled": false},
        "tls": {"secretName": "my-webhook-tls", "caBundle": ca},
        "scheduler": {"enabled": true}
    })) else {
        return;
    };
    assert!(!r.has("Certificate") && !r.has("Issuer"));
    assert_eq!(r.volume("tls")["secret"]["secretName"], "my-webhook-tls");
    for (kind, config, hook) in webhooks(&r) {
        assert!(config["metadata"].get("annotations").is_none(), "{kind}");
        assert_eq!(hook["clientConfig"]["caBundle"], ca.as_str(), "{kind}");
    }
    // The scheduler trusts the same CA, from a ConfigMap made of caBundle.
    let cm = r.get("ConfigMap", &format!("{RELEASE}-ca"));
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(&ca)
        .unwrap();
    assert_eq!(
        s(&cm["data"]["ca.crt"]).trim(),
        String::from_utf8(pem).unwrap().trim()
    );
}

// ---------------------------------------------------------------------------------------
// Scheduler

fn scheduler_config(r: &Rendered) -> Value {
    let cm = r.get("ConfigMap", &format!("{RELEASE}-scheduler-config"));
    serde_yaml::from_str(s(&cm["data"]["config.yaml"])).unwrap()
}

#[test]
fn the_second_scheduler_calls_the_extender_verbs_over_tls() {
    if let Some(r) = render(json!({})) {
        assert_eq!(r.all("Deployment").len(), 1, "no scheduler unless enabled");
    }
    let version_tag = regex::Regex::new(r"^v1\.\d+\.\d+$").unwrap();
    for role in ["manager", "worker"] {
        let Some(r) = render(
            json!({"role": role, "scheduler": {"enabled": true, "extender": {"weight": 7, "ignorable": true}}}),
        ) else {
            return;
        };
        let config = scheduler_config(&r);
        assert_eq!(config["apiVersion"], "kubescheduler.config.k8s.io/v1");
        assert_eq!(config["kind"], "KubeSchedulerConfiguration");
        assert_eq!(
            config["profiles"],
            json!([{"schedulerName": "switchyard-scheduler"}])
        );
        let ext = &config["extenders"][0];
        let url = s(&ext["urlPrefix"]);
        let service = r.get("Service", &format!("{RELEASE}-webhook"));
        let authority = format!(
            "https://{}.{NAMESPACE}.svc:{}",
            s(&service["metadata"]["name"]),
            service["spec"]["ports"][0]["port"]
        );
        let prefix = url
            .strip_prefix(&authority)
            .unwrap_or_else(|| panic!("{url} is not the Service over HTTPS ({authority})"));
        let verb_path = |verb: &Value| format!("{prefix}/{}", s(verb));
        assert_eq!(
            verb_path(&ext["filterVerb"]),
            switchyard::extender::FILTER_PATH
        );
        assert_eq!(
            verb_path(&ext["prioritizeVerb"]),
            switchyard::extender::PRIORITIZE_PATH
        );
        assert!(
            ext.get("bindVerb").is_none(),
            "kube-scheduler binds unless asked"
        );
        assert_eq!(ext["enableHTTPS"], true);
        assert_eq!(ext["nodeCacheCapable"], true);
        assert_eq!(ext["weight"], 7);
        assert_eq!(ext["ignorable"], true);
        assert!(ext.get("managedResources").is_none());

        // caFile is the CA of the serving certificate, mounted as a directory.
        let deploy = r.get("Deployment", &format!("{RELEASE}-scheduler"));
        let pod = &deploy["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let ca_file = Path::new(s(&ext["tlsConfig"]["caFile"]));
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| Path::new(s(&m["mountPath"])) == ca_file.parent().unwrap())
            .expect("caFile's directory is mounted");
        assert!(mount.get("subPath").is_none());
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(
            volume["secret"]["secretName"],
            r.volume("tls")["secret"]["secretName"]
        );
        assert_eq!(
            volume["secret"]["items"],
            json!([{"key": "ca.crt", "path": ca_file.file_name().unwrap().to_str().unwrap()}]),
            "only the CA, never the serving key"
        );
        let image = s(&c["image"]);
        let tag = image
            .strip_prefix("registry.k8s.io/kube-scheduler:")
            .unwrap();
        assert!(version_tag.is_match(tag), "{image}");
        assert!(c["command"]
            .as_array()
            .unwrap()
            .contains(&json!("--config=/etc/kubernetes/switchyard/config.yaml")));
        let config_mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/etc/kubernetes/switchyard")
            .unwrap();
        let config_volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == config_mount["name"])
            .unwrap();
        assert_eq!(
            config_volume["configMap"]["name"],
            format!("{RELEASE}-scheduler-config")
        );

        // Its own leader election, and the upstream scheduler's RBAC.
        let le = &config["leaderElection"];
        assert_eq!(le["leaderElect"], true);
        assert_eq!(le["resourceNamespace"], NAMESPACE);
        let lease_role = r.get("Role", &format!("{RELEASE}-scheduler-leader"));
        assert_eq!(
            lease_role["rules"][0]["resourceNames"],
            json!([le["resourceName"]])
        );
        assert_eq!(lease_role["rules"][0]["verbs"], json!(["get", "update"]));
        let sa = s(&pod["serviceAccountName"]);
        let bound: BTreeSet<&str> = r
            .all("ClusterRoleBinding")
            .iter()
            .filter(|b| b.value["subjects"][0]["name"] == sa)
            .map(|b| s(&b.value["roleRef"]["name"]))
            .collect();
        assert_eq!(
            bound,
            BTreeSet::from(["system:kube-scheduler", "system:volume-scheduler"])
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);

        // The extender really answers at those paths.
        let paths = [
            verb_path(&ext["filterVerb"]),
            verb_path(&ext["prioritizeVerb"]),
        ];
        live_server(&r, |mut conn| async move {
            for (path, fixture) in paths.iter().zip([
                "extender-filter-nodenames",
                "extender-prioritize-nodenames-guaranteed",
            ]) {
                let body = std::fs::read(repo(&format!("tests/fixtures/extender/{fixture}.json")))
                    .unwrap();
                let (status, reply) = conn.post_json(path, body).await;
                assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&reply));
            }
        });
    }
    let Some(r) = render(
        json!({"scheduler": {"enabled": true, "extender": {"bind": true}, "image": {"tag": "v1.33.1"}}}),
    ) else {
        return;
    };
    let ext = &scheduler_config(&r)["extenders"][0];
    let prefix = s(&ext["urlPrefix"]).rsplit_once(".svc:443").unwrap().1;
    assert_eq!(
        format!("{prefix}/{}", s(&ext["bindVerb"])),
        switchyard::extender::BIND_PATH
    );
    let deploy = r.get("Deployment", &format!("{RELEASE}-scheduler"));
    assert_eq!(
        deploy["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.k8s.io/kube-scheduler:v1.33.1"
    );
}

// ---------------------------------------------------------------------------------------
// RBAC against the table of API calls

/// What the bindings of one ServiceAccount grant: (group, resource, verb, namespace or None
/// for cluster-wide), with the rule's document for messages.
fn grants(r: &Rendered, sa: &str) -> Vec<(String, String, String, Option<String>)> {
    let mut out = Vec::new();
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for binding in r.all(kind) {
            let b = &binding.value;
            let bound = b["subjects"].as_array().unwrap().iter().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == NAMESPACE
            });
            if !bound {
                continue;
            }
            let role_kind = s(&b["roleRef"]["kind"]);
            let role_name = s(&b["roleRef"]["name"]);
            let namespace =
                (kind == "RoleBinding").then(|| s(&b["metadata"]["namespace"]).to_string());
            let role = r
                .docs
                .iter()
                .find(|d| {
                    d.value["kind"] == role_kind
                        && d.value["metadata"]["name"] == role_name
                        && (role_kind == "ClusterRole"
                            || d.value["metadata"]["namespace"] == json!(namespace))
                })
                .unwrap_or_else(|| {
                    panic!("{kind} {} refers to {role_kind} {role_name}, which the chart does not render", b["metadata"]["name"])
                });
            assert_rules_say_why(role);
            for rule in role.value["rules"].as_array().unwrap() {
                assert!(
                    rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
                    "{rule}"
                );
                for g in rule["apiGroups"].as_array().unwrap() {
                    for res in rule["resources"].as_array().unwrap() {
                        for v in rule["verbs"].as_array().unwrap() {
                            for x in [g, res, v] {
                                assert_ne!(x, "*", "no wildcards: {rule}");
                            }
                            out.push((
                                s(g).to_string(),
                                s(res).to_string(),
                                s(v).to_string(),
                                namespace.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Every rule of a Role or ClusterRole has a comment line right above it saying what it is for.
fn assert_rules_say_why(role: &Doc) {
    let lines: Vec<&str> = role.text.lines().collect();
    let mut rules = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("- apiGroups:") {
            rules += 1;
            let above = lines[..i].iter().rev().find(|l| !l.trim().is_empty());
            let comment = above.map(|l| l.trim_start()).unwrap_or("");
            assert!(
                comment.starts_with('#') && comment.len() > 20,
                "{} {}: rule at line {} has no comment saying why:\n{}",
                role.value["kind"],
                role.value["metadata"]["name"],
                i + 1,
                role.text
            );
        }
    }
    assert_eq!(rules, role.value["rules"].as_array().unwrap().len());
}

/// The chart grants `sa` exactly the table's entries for `identity` with `features` on.
fn assert_rbac_is_the_table(r: &Rendered, identity: Role, features: &[Feature], sa: &str) {
    let granted = grants(r, sa);
    let own = NAMESPACE;
    // Every use of the table is granted, in its scope.
    for u in rbac::uses_with(identity, features) {
        for verb in u.verbs {
            let ok = granted.iter().any(|(g, res, v, ns)| {
                g == u.group
                    && res == u.resource
                    && v == verb
                    && match u.scope {
                        Scope::Cluster | Scope::AllNamespaces => ns.is_none(),
                        Scope::OwnNamespace => ns.as_deref().is_none_or(|n| n == own),
                        Scope::Namespace(want) => ns.as_deref().is_none_or(|n| n == want),
                    }
            });
            assert!(
                ok,
                "{identity:?} ({sa}, {features:?}) lacks {verb} on {}/{} ({:?}): {}",
                u.group, u.resource, u.scope, u.why
            );
        }
    }
    // Nothing is granted that the table does not list, nor wider than it lists it.
    for (g, res, v, ns) in &granted {
        let listed = rbac::uses_with(identity, features).any(|u| {
            u.group == g
                && u.resource == res
                && u.verbs.contains(&v.as_str())
                && match (u.scope, ns.as_deref()) {
                    (Scope::Cluster | Scope::AllNamespaces, None) => true,
                    (Scope::OwnNamespace, Some(n)) => n == own,
                    (Scope::Namespace(want), Some(n)) => n == want,
                    _ => false,
                }
        });
        assert!(
            listed,
            "{identity:?} ({sa}, {features:?}) is granted {v} on {g}/{res} in {} but src/rbac.rs does not list it there: add the use to API_USES or remove the rule",
            ns.as_deref().unwrap_or("the whole cluster")
        );
    }
}

#[test]
fn rbac_grants_each_role_exactly_the_api_calls_the_code_makes() {
    let Some(manager) = render(json!({"scheduler": {"enabled": true}})) else {
        return;
    };
    assert_rbac_is_the_table(&manager, Role::Manager, &[], RELEASE);
    let Some(worker) = render(json!({"role": "worker", "scheduler": {"enabled": true}})) else {
        return;
    };
    assert_rbac_is_the_table(&worker, Role::Worker, &[], RELEASE);
    assert_rbac_is_the_table(
        &worker,
        Role::WorkerSide,
        &[],
        &format!("{RELEASE}-dispatcher"),
    );
    // The scheduler's own rule (beyond the upstream ClusterRoles) says why too.
    assert_rules_say_why(manager.doc("Role", &format!("{RELEASE}-scheduler-leader")));
}

// ---------------------------------------------------------------------------------------
// JobSet

const JOBSET_API: &str = "jobset.x-k8s.io/v1alpha2";
// The paths the server answers JobSet reviews on, as issue 22 decided them (src/server.rs).
const MUTATE_JOBSET_PATH: &str = "/mutate-jobset-x-k8s-io-v1alpha2-jobset";
const VALIDATE_JOBSET_PATH: &str = "/validate-jobset-x-k8s-io-v1alpha2-jobset";

/// Values for jobset.enabled, what the cluster serves, and whether JobSets are then on.
fn jobset_settings() -> Vec<(Value, Vec<&'static str>, bool)> {
    vec![
        // auto: by the API versions Helm sees (a group/version, or a group/version/Kind).
        (json!({}), vec![], false),
        (json!({}), vec![JOBSET_API], true),
        (json!({}), vec!["jobset.x-k8s.io/v1alpha2/JobSet"], true),
        (
            json!({"jobset": {"enabled": "auto"}}),
            vec!["jobset.x-k8s.io/v1alpha1"],
            false,
        ),
        (json!({"jobset": {"enabled": true}}), vec![], true),
        (
            json!({"jobset": {"enabled": false}}),
            vec![JOBSET_API],
            false,
        ),
    ]
}

#[test]
fn kueue_read_access_in_a_worker_follows_the_value() {
    for (enabled, features) in [(false, &[][..]), (true, &[Feature::Kueue][..])] {
        let values =
            json!({"role": "worker", "jobset": {"enabled": false}, "kueue": {"enabled": enabled}});
        let Some(r) = render(values) else {
            return;
        };
        assert_rbac_is_the_table(&r, Role::Worker, features, RELEASE);
        assert_rbac_is_the_table(
            &r,
            Role::WorkerSide,
            features,
            &format!("{RELEASE}-dispatcher"),
        );
    }
}

#[test]
fn jobset_rbac_and_webhooks_follow_the_value_and_the_cluster() {
    for (jobset, api_versions, on) in jobset_settings() {
        let features: &[Feature] = if on { &[Feature::JobSet] } else { &[] };
        for role in ["manager", "worker"] {
            let mut values = jobset.clone();
            values["role"] = json!(role);
            let case = format!("{values} on {api_versions:?}");
            let Some(r) = render_on(values, &api_versions) else {
                return;
            };
            if role == "manager" {
                assert_rbac_is_the_table(&r, Role::Manager, features, RELEASE);
                let names: Vec<&str> = webhooks(&r).iter().map(|(_, _, h)| s(&h["name"])).collect();
                let mut want = vec!["mutate-job.switchyard.dev"];
                want.extend(on.then_some("mutate-jobset.switchyard.dev"));
                want.push("validate-job.switchyard.dev");
                want.extend(on.then_some("validate-jobset.switchyard.dev"));
                assert_eq!(names, want, "{case}");
            } else {
                assert_rbac_is_the_table(&r, Role::Worker, features, RELEASE);
                assert_rbac_is_the_table(
                    &r,
                    Role::WorkerSide,
                    features,
                    &format!("{RELEASE}-dispatcher"),
                );
            }
            if on {
                assert!(r.notes.contains("JobSets"), "{case}: the notes say so");
            } else {
                // Off, nothing about JobSets is rendered, not even a comment, but the
                // configuration's `jobsets: false` (without it the server would decide alone,
                // and could watch JobSets the RBAC does not grant).
                for text in r.docs.iter().map(|d| &d.text).chain([&r.notes]) {
                    let text = text.replace("jobsets: false", "");
                    assert!(
                        !text.to_ascii_lowercase().contains("jobset"),
                        "{case}:\n{text}"
                    );
                }
            }
        }
    }
}

/// The JobSet hooks are the Job hooks for another resource, whatever the webhook values: only
/// the name, the path and the rule's group, version and resource differ.
#[test]
fn jobset_webhooks_mirror_the_job_webhooks() {
    let variants = [
        json!({}),
        json!({"config": {"defaultQueue": "research", "managedNamespaces": {}}}),
        json!({"webhooks": {
            "failurePolicy": "Ignore",
            "timeoutSeconds": 12,
            "namespaceSelector": {
                "matchLabels": {"switchyard.dev/managed": "true"},
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]
            },
            "mutating": {"reinvocationPolicy": "IfNeeded", "objectSelector": {"matchLabels": {"batch": "yes"}}},
            "validating": {"objectSelector": {"matchLabels": {"batch": "yes"}}}
        }}),
        json!({"certManager": {"enabled": false}, "tls": {"secretName": "mine", "caBundle": base64_ca()}}),
    ];
    for mut values in variants {
        values["jobset"] = json!({"enabled": true});
        let Some(r) = render(values.clone()) else {
            return;
        };
        for (kind, config, job_hook, jobset_hook, path, operations) in [
            (
                "MutatingWebhookConfiguration",
                "mutating",
                "mutate-job.switchyard.dev",
                "mutate-jobset.switchyard.dev",
                MUTATE_JOBSET_PATH,
                json!(["CREATE"]),
            ),
            (
                "ValidatingWebhookConfiguration",
                "validating",
                "validate-job.switchyard.dev",
                "validate-jobset.switchyard.dev",
                VALIDATE_JOBSET_PATH,
                json!(["CREATE", "UPDATE"]),
            ),
        ] {
            let hooks = r.get(kind, &format!("{RELEASE}-{config}"))["webhooks"]
                .as_array()
                .unwrap();
            let hook = |name: &str| {
                hooks
                    .iter()
                    .find(|h| h["name"] == name)
                    .unwrap_or_else(|| panic!("{values}: no {name} in {kind}"))
            };
            let (job, jobset) = (hook(job_hook), hook(jobset_hook));
            assert_eq!(
                jobset["rules"],
                json!([{
                    "apiGroups": ["jobset.x-k8s.io"],
                    "apiVersions": ["v1alpha2"],
                    "resources": ["jobsets"],
                    "operations": operations,
                    "scope": "Namespaced"
                }]),
                "{values}: {kind}"
            );
            assert_eq!(
                job["rules"][0]["operations"], operations,
                "{values}: {kind}"
            );
            let mut mirrored = job.clone();
            mirrored["name"] = json!(jobset_hook);
            mirrored["clientConfig"]["service"]["path"] = json!(path);
            mirrored["rules"] = jobset["rules"].clone();
            assert_eq!(jobset, &mirrored, "{values}: {kind}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Roles

#[test]
fn the_worker_role_installs_the_extender_and_the_managers_access_only() {
    let Some(r) = render(json!({"role": "worker"})) else {
        return;
    };
    assert!(!r.has("MutatingWebhookConfiguration") && !r.has("ValidatingWebhookConfiguration"));
    let config = r.config();
    assert_eq!(config.get("role").unwrap(), "worker");
    for manager_only in [
        "leaderElection",
        "dispatcherUsernames",
        "virtualNodes",
        "managerId",
    ] {
        assert!(config.get(manager_only).is_none(), "{manager_only}");
    }
    let settings = r.settings();
    assert!(
        !settings.standalone && settings.inventory.is_none(),
        "the live inventory of this cluster"
    );
    let sa = format!("{RELEASE}-dispatcher");
    r.get("ServiceAccount", &sa);
    let token = r.get("Secret", &format!("{sa}-token"));
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        sa.as_str()
    );
    assert!(
        r.notes.contains(&format!("{sa}-token")),
        "the notes name the token Secret"
    );
    assert!(r.notes.contains("WorkerCluster"));
    let kinds: BTreeSet<&str> = r.docs.iter().map(|d| s(&d.value["kind"])).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "Certificate",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Issuer",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "ServiceAccount"
        ])
    );
    // The notes give the one command that registers the worker with the manager.
    assert!(
        r.notes.contains("switchyard register-worker")
            && r.notes.contains(&format!("--token-secret {sa}-token")),
        "{}",
        r.notes
    );
    let Some(r) = render(json!({"role": "worker", "scheduler": {"enabled": true}})) else {
        return;
    };
    assert!(
        r.notes.contains("--scheduler-name switchyard-scheduler"),
        "{}",
        r.notes
    );
    let Some(r) = render(json!({"role": "worker", "workerAccess": {"createTokenSecret": false}}))
    else {
        return;
    };
    assert!(!r.has("Secret"));
    // No token Secret to read: the notes say how to mint a token instead.
    assert!(
        r.notes.contains("kubectl -n") && r.notes.contains("create token"),
        "{}",
        r.notes
    );
}

#[test]
fn notes_say_what_to_do_next() {
    let Some(r) = render(json!({})) else { return };
    for what in [
        "WorkerCluster",
        "DispatchQueue",
        wellknown::QUEUE_LABEL,
        "--skip-crds",
        "role=worker",
        "switchyard register-worker",
    ] {
        assert!(
            r.notes.contains(what),
            "NOTES.txt does not mention {what}:\n{}",
            r.notes
        );
    }
}

// ---------------------------------------------------------------------------------------
// values.schema.json

#[test]
fn bad_values_are_refused_at_install_with_a_message_naming_them() {
    let cases = [
        (json!({"role": "boss"}), "/role"),
        (json!({"replicas": 0}), "/replicas"),
        (json!({"replica": 3}), "replica"),
        (
            json!({"webhooks": {"failurePolicy": "Maybe"}}),
            "/webhooks/failurePolicy",
        ),
        (
            json!({"webhooks": {"timeoutSeconds": 60}}),
            "/webhooks/timeoutSeconds",
        ),
        (
            json!({"config": {"inflightTtl": "30 seconds"}}),
            "/config/inflightTtl",
        ),
        (json!({"config": {"defaultQeue": "x"}}), "defaultQeue"),
        // switchyard refuses zero for these at start-up: refused at install instead.
        (
            json!({"config": {"shutdownTimeout": "0s"}}),
            "/config/shutdownTimeout",
        ),
        (
            json!({"config": {"namespaceCacheTtl": "0"}}),
            "/config/namespaceCacheTtl",
        ),
        (
            json!({"config": {"tlsReloadInterval": "0ms"}}),
            "/config/tlsReloadInterval",
        ),
        (
            json!({"config": {"staleAfter": "0s"}}),
            "/config/staleAfter",
        ),
        (
            json!({"config": {"inflightTtl": "0m"}}),
            "/config/inflightTtl",
        ),
        (
            json!({"config": {"defaultQueue": "Not_A_Label"}}),
            "/config/defaultQueue",
        ),
        (
            json!({"config": {"placementStrategy": "Random"}}),
            "/config/placementStrategy",
        ),
        (json!({"ports": {"https": 70000}}), "/ports/https"),
        (
            json!({"image": {"pullPolicy": "Sometimes"}}),
            "/image/pullPolicy",
        ),
        (
            json!({"scheduler": {"extender": {"weight": 0}}}),
            "/scheduler/extender/weight",
        ),
        (json!({"certManager": {"enabled": false}}), "/tls"),
        (
            json!({"certManager": {"issuerRef": {"name": "x"}}}),
            "/certManager/issuerRef",
        ),
        (
            json!({"leaderElection": {"leaseName": "Not Valid"}}),
            "/leaderElection/leaseName",
        ),
        (json!({"jobset": {"enabled": "yes"}}), "/jobset/enabled"),
        (json!({"jobset": {"enable": true}}), "enable"),
        // A check the schema cannot make, from the template.
        (
            json!({"config": {"defaultQueue": "research"}, "webhooks": {"mutating": {"objectSelector": {"matchExpressions": [{"key": wellknown::QUEUE_LABEL, "operator": "Exists"}]}}}}),
            "config.defaultQueue",
        ),
    ];
    for (values, names) in cases {
        let Some(message) = refusal(values.clone()) else {
            return;
        };
        assert!(
            message.contains(names),
            "{values}: the refusal does not name {names:?}:\n{message}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// A server started from the chart's settings

/// Starts `serve` in-process with the chart's resolved settings (loopback ports, a dev
/// certificate, no API server), checks every probe path the pod uses on the probe port, and
/// hands `check` an HTTPS connection.
fn live_server<F, Fut>(r: &Rendered, check: F)
where
    F: FnOnce(common::tls_client::Connection) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut settings = r.settings();
    let dir = tempfile::tempdir().unwrap();
    settings.listen = ([127, 0, 0, 1], 0).into();
    settings.probe_listen = ([127, 0, 0, 1], 0).into();
    settings.tls = TlsSource::Dev(dir.path().into());
    settings.standalone = true;
    settings.workers = 1;
    let probe_paths: Vec<String> = ["livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| s(&r.container()[p]["httpGet"]["path"]).to_string())
        .chain(std::iter::once(wellknown::METRICS_PATH.to_string()))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        switchyard::install_crypto_provider();
        let running = switchyard::server::start_with_client(settings, None)
            .await
            .expect("the server starts with the chart's settings");
        for path in &probe_paths {
            let (status, body) = common::probe_get(running.probe_addr, path).await;
            assert_eq!(status, 200, "{path}: {body}");
        }
        let tls = common::tls_client::connector_from_dir(dir.path());
        let conn = common::tls_client::connect(&tls, running.https_addr, "localhost")
            .await
            .unwrap();
        check(conn).await;
        running.shutdown().await;
    });
}
