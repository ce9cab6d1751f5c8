//! Random and mutated bodies thrown at both hooks: always a well-formed reply or a one-line
//! reason for a 4xx, never a panic; a patch always applies to the object it was made for and
//! keeps everything it does not change. Then hostile HTTP over the real server: a 4xx with a
//! one-line reason, never a hang.

mod common;

use proptest::prelude::*;
use serde_json::{json, Value};
use std::time::Duration;
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::webhook::{review_body, AdmissionPolicy, BadReview, Hook};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FIXTURES: &[&str] = &[
    "admission-mutate-create-basic",
    "admission-validate-update-unsuspend-alice",
    "admission-validate-update-status-external-running-admin",
    "validate-update-unlabel-dispatched",
    "mutate-create-default-namespace",
];

fn check(body: &[u8]) {
    let policy = AdmissionPolicy {
        default_queue: Some("q".into()),
        managed_namespaces: Some(Default::default()),
        ..AdmissionPolicy::default()
    };
    let labels = Default::default();
    for hook in [Hook::Mutate, Hook::Validate] {
        match review_body(hook, body, &policy, Some(&labels)) {
            Ok((reply, decision)) => {
                let reply: Value = serde_json::from_slice(&reply).expect("reply is JSON");
                let response = &reply["response"];
                assert!(response["uid"].as_str().is_some_and(|u| !u.is_empty()));
                assert_eq!(response["allowed"], decision.allowed());
                assert_eq!(response.get("patchType").is_some(), decision.mutated());
                if let Some(patch) = common::patch_of(&reply) {
                    assert_eq!(patch, decision.patch);
                    // Bodies that are not UTF-8 JSON are never sent by the API server; the
                    // patch is checked against every body that is.
                    if let Ok(review) = serde_json::from_slice::<Value>(body) {
                        patch_keeps_what_it_does_not_change(&review["request"]["object"], &patch);
                    }
                }
                if !decision.allowed() {
                    let code = response["status"]["code"].as_u64().unwrap();
                    assert!((400..600).contains(&code));
                }
            }
            Err(BadReview::Unreadable(line)) => {
                assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
            }
            Err(other) => panic!("review_body only returns Unreadable errors: {other:?}"),
        }
    }
}

/// `patch` applies to `object`, and every value in `object` outside the paths it writes is
/// still there, unchanged.
fn patch_keeps_what_it_does_not_change(object: &Value, patch: &json_patch::Patch) {
    let mut patched = object.clone();
    json_patch::patch(&mut patched, patch)
        .unwrap_or_else(|e| panic!("the patch {patch:?} does not apply: {e}\nto {object}"));
    let written: Vec<String> = serde_json::to_value(patch)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap().to_string())
        .collect();
    let mut before = Vec::new();
    common::pointers(object, String::new(), &mut before);
    // On a written path, under one, or above one (whose value holds the written one).
    let related = |a: &str, b: &str| {
        a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"))
    };
    for p in before {
        if !written.iter().any(|w| related(&p, w)) {
            assert_eq!(
                patched.pointer(&p),
                object.pointer(&p),
                "{p} changed by {patch:?}"
            );
        }
    }
}

/// A JSON value of any shape, small.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-zA-Z0-9/._~-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
    Truncate(usize),
    FlipByte(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::FlipByte(i, b)),
    ]
}

fn apply(fixture: &str, mutations: &[Mutation]) -> Vec<u8> {
    let mut v = common::fixture_json(fixture);
    let mut bytes = None;
    for m in mutations {
        let mut all = Vec::new();
        common::pointers(&v, String::new(), &mut all);
        match m {
            Mutation::Replace(i, new) => {
                let p = &all[i % all.len()];
                if p.is_empty() {
                    v = new.clone();
                } else if let Some(slot) = v.pointer_mut(p) {
                    *slot = new.clone();
                }
            }
            Mutation::Remove(i) => {
                let p = &all[i % all.len()];
                if let Some((parent, key)) = p.rsplit_once('/') {
                    if let Some(Value::Object(m)) = v.pointer_mut(parent) {
                        m.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                }
            }
            Mutation::Truncate(_) | Mutation::FlipByte(..) => {}
        }
    }
    for m in mutations {
        let b = bytes.get_or_insert_with(|| serde_json::to_vec(&v).unwrap());
        match m {
            Mutation::Truncate(at) if !b.is_empty() => b.truncate(at % b.len()),
            Mutation::FlipByte(at, x) if !b.is_empty() => {
                let n = b.len();
                b[at % n] ^= x;
            }
            _ => {}
        }
    }
    bytes.unwrap_or_else(|| serde_json::to_vec(&v).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        check(&body);
    }

    #[test]
    fn random_json_never_panics(v in any_json()) {
        check(&serde_json::to_vec(&v).unwrap());
        check(&serde_json::to_vec(&json!({"request": v})).unwrap());
    }

    #[test]
    fn mutated_reviews_never_panic(
        fixture in prop::sample::select(FIXTURES),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        check(&apply(fixture, &mutations));
    }
}

/// Hostile HTTP, each exchange on its own connection over real TLS. Each must end in a 4xx
/// whose body is one line, within a bound that fails the test rather than waits.
mod over_http {
    use super::*;

    /// Small enough that over-limit bodies are cheap to send.
    const LIMIT: usize = 256 * 1024;

    struct Server {
        running: switchyard::server::Running,
        tls: tokio_rustls::TlsConnector,
        _dir: tempfile::TempDir,
    }

    async fn server() -> Server {
        switchyard::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.path().into()));
        settings.max_review_bytes = LIMIT;
        settings.body_timeout = Duration::from_secs(2);
        let running = switchyard::server::start(settings).await.unwrap();
        let tls = common::tls_client::connector_from_dir(dir.path());
        Server {
            running,
            tls,
            _dir: dir,
        }
    }

    /// Writes `head` and then `body` (as much of it as the server takes) and reads the reply
    /// by its Content-Length (the connection may stay open, e.g. to drain a chunked body the
    /// handler refused); the server must answer within 10 s.
    async fn exchange(server: &Server, head: String, body: &[u8]) -> (u16, String) {
        let tcp = tokio::net::TcpStream::connect(server.running.https_addr)
            .await
            .unwrap();
        let mut stream = server
            .tls
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .unwrap();
        let talk = async {
            stream.write_all(head.as_bytes()).await.unwrap();
            // A server that refuses early may close before taking the rest.
            let _ = stream.write_all(body).await;
            let _ = stream.flush().await;
            let mut reply = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                if let Some(done) = complete_reply(&reply) {
                    return done;
                }
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => panic!(
                        "connection ended before a whole reply: {:?}",
                        String::from_utf8_lossy(&reply)
                    ),
                    Ok(n) => reply.extend_from_slice(&buf[..n]),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), talk)
            .await
            .unwrap_or_else(|_| panic!("no reply within 10 s to {head:?}"))
    }

    /// The status and body of `bytes` once they hold a whole reply with a Content-Length.
    fn complete_reply(bytes: &[u8]) -> Option<(u16, String)> {
        let text = String::from_utf8_lossy(bytes);
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        let length: usize = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })?;
        (body.len() >= length).then(|| (status, body[..length].to_string()))
    }

    fn head(content_type: Option<&str>, framing: &str) -> String {
        let mut h = String::from(
            "POST /mutate-batch-v1-job HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n",
        );
        if let Some(t) = content_type {
            h += &format!("content-type: {t}\r\n");
        }
        h + framing + "\r\n"
    }

    fn chunked(parts: &[&[u8]], last: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
            out.extend_from_slice(p);
            out.extend_from_slice(b"\r\n");
        }
        if last {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        out
    }

    /// A 4xx in the given range whose body is exactly one line mentioning `mentions`.
    fn refused(what: &str, (status, body): (u16, String), want: u16, mentions: &str) {
        assert_eq!(status, want, "{what}: {body}");
        assert!(
            body.ends_with('\n') && body.trim_end().lines().count() == 1,
            "{what}: one line, got {body:?}"
        );
        assert!(body.contains(mentions), "{what}: {body:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_requests_get_a_one_line_4xx_never_a_hang() {
        let server = server().await;
        let review = common::fixture("admission-mutate-create-basic");
        let sized = |n: usize| format!("content-length: {n}\r\n");

        let r = exchange(
            &server,
            head(Some("text/plain"), &sized(review.len())),
            &review,
        )
        .await;
        refused("wrong content type", r, 415, "application/json");
        let r = exchange(&server, head(None, &sized(review.len())), &review).await;
        refused("no content type", r, 415, "application/json");

        // Declared over the limit: refused from the headers, before any of the body.
        let r = exchange(
            &server,
            head(Some("application/json"), &sized(LIMIT + 1)),
            b"",
        )
        .await;
        refused("declared oversize", r, 413, &LIMIT.to_string());

        // Chunked, so no length to judge by: refused once the bytes pass the limit.
        let block = vec![b' '; 16 * 1024];
        let blocks: Vec<&[u8]> =
            std::iter::repeat_n(block.as_slice(), LIMIT / block.len() + 1).collect();
        let r = exchange(
            &server,
            head(Some("application/json"), "transfer-encoding: chunked\r\n"),
            &chunked(&blocks, false),
        )
        .await;
        refused("chunked oversize", r, 413, &LIMIT.to_string());

        // A chunked body that is not a review, and one cut short mid-JSON.
        let r = exchange(
            &server,
            head(Some("application/json"), "transfer-encoding: chunked\r\n"),
            &chunked(&[b"{\"kind\":", b"\"AdmissionReview\"}"], true),
        )
        .await;
        refused("chunked, no request", r, 400, "no request");
        let r = exchange(
            &server,
            head(Some("application/json"), "transfer-encoding: chunked\r\n"),
            &chunked(&[&review[..review.len() / 2]], true),
        )
        .await;
        refused("chunked, truncated", r, 400, "not a JSON AdmissionReview");

        // Nesting far past any parser's recursion limit, at the top and inside the object.
        let deep = |prefix: &str| {
            let mut b = prefix.as_bytes().to_vec();
            b.extend(std::iter::repeat_n(b'[', 100_000));
            b.extend(std::iter::repeat_n(b']', 100_000));
            b
        };
        let body = deep("");
        let r = exchange(
            &server,
            head(Some("application/json"), &sized(body.len())),
            &body,
        )
        .await;
        refused("deeply nested", r, 400, "not a JSON AdmissionReview");
        let body =
            deep(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":"#);
        let r = exchange(
            &server,
            head(Some("application/json"), &sized(body.len())),
            &body,
        )
        .await;
        refused(
            "deeply nested request",
            r,
            400,
            "not a JSON AdmissionReview",
        );

        // A body that never arrives is refused once the body timeout passes.
        let r = exchange(
            &server,
            head(Some("application/json"), &sized(review.len())),
            &review[..10],
        )
        .await;
        refused("stalled body", r, 408, "did not arrive");

        // And the server still answers a real review, chunked or not.
        let r = exchange(
            &server,
            head(Some("application/json"), "transfer-encoding: chunked\r\n"),
            &chunked(&[&review[..100], &review[100..]], true),
        )
        .await;
        assert_eq!(r.0, 200, "{}", r.1);
        assert!(r.1.contains("\"allowed\":true"), "{}", r.1);
        server.running.shutdown().await;
    }
}
