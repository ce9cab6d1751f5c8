//! Shared test support: fixtures, patch application, a fake API server, and a TLS client that verifies the
//! server certificate against the test CA.
#![allow(dead_code)]

pub mod dispatch;
pub mod fake_api;
pub mod fleet;
pub mod job_rules;
pub mod jobset_rules;

use base64::Engine;
use serde_json::Value;
use std::path::{Path, PathBuf};

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission")
}

pub fn fixture_path(name: &str) -> PathBuf {
    fixture_dir().join(format!("{name}.json"))
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture_path(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

pub fn fixture_json(name: &str) -> Value {
    serde_json::from_slice(&fixture(name)).expect("fixture is JSON")
}

/// Every JSON Pointer in `v`, so a mutation can target any node.
pub fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                pointers(
                    c,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                )
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                pointers(c, format!("{at}/{i}"), out)
            }
        }
        _ => {}
    }
}

/// The JSONPatch operations of a reply, or `None` when the reply carries no patch.
pub fn patch_of(reply: &Value) -> Option<json_patch::Patch> {
    let b64 = reply["response"]["patch"].as_str()?;
    assert_eq!(
        reply["response"]["patchType"], "JSONPatch",
        "a patch needs patchType JSONPatch"
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("patch is base64");
    Some(serde_json::from_slice(&bytes).expect("patch is a JSONPatch"))
}

/// The review's object with the reply's patch applied, as the API server would store it.
pub fn patched_object(review: &Value, reply: &Value) -> Value {
    let mut object = review["request"]["object"].clone();
    if let Some(p) = patch_of(reply) {
        json_patch::patch(&mut object, &p).expect("patch applies to the object");
    }
    object
}

/// Every reply must echo the request's uid, apiVersion and kind.
pub fn assert_echo(review: &Value, reply: &Value) {
    assert_eq!(reply["apiVersion"], review["apiVersion"]);
    assert_eq!(reply["kind"], review["kind"]);
    assert_eq!(reply["response"]["uid"], review["request"]["uid"]);
    if reply["response"].get("patch").is_none() {
        assert!(
            reply["response"].get("patchType").is_none(),
            "patchType only with a patch: {reply}"
        );
    }
}

pub mod tls_client {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::net::SocketAddr;
    use std::path::Path;
    use std::sync::Arc;
    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;

    /// A client that trusts only `ca_pem`, optionally presenting a client certificate.
    pub fn connector(ca_pem: &[u8], client: Option<(&[u8], &[u8])>) -> TlsConnector {
        switchyard::install_crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem) {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(cert)
                        .map(Result::unwrap)
                        .collect(),
                    PrivateKeyDer::from_pem_slice(key).unwrap(),
                )
                .unwrap(),
        };
        // Go's TLS client (kube-apiserver's) keeps no session cache: every connection is a
        // full handshake that shows the certificate being served now.
        config.resumption = rustls::client::Resumption::disabled();
        TlsConnector::from(Arc::new(config))
    }

    pub fn connector_from_dir(dir: &Path) -> TlsConnector {
        connector(&std::fs::read(dir.join("ca.crt")).unwrap(), None)
    }

    /// One kept-alive HTTPS connection.
    pub struct Connection {
        pub sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        /// The certificate the server presented in this connection's handshake.
        pub server_cert: CertificateDer<'static>,
    }

    pub async fn connect(
        connector: &TlsConnector,
        addr: SocketAddr,
        name: &str,
    ) -> std::io::Result<Connection> {
        let tcp = TcpStream::connect(addr).await?;
        let tls = connector
            .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
            .await?;
        let server_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first().cloned())
            .expect("server presented a certificate");
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok(Connection {
            sender,
            server_cert,
        })
    }

    impl Connection {
        /// POSTs `body` to `path`; returns the status and the body.
        pub async fn post(
            &mut self,
            path: &str,
            content_type: &str,
            body: Vec<u8>,
        ) -> (u16, Vec<u8>) {
            let req = hyper::Request::post(path)
                .header("host", "localhost")
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            self.sender.ready().await.expect("connection ready");
            let res = self.sender.send_request(req).await.expect("response");
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
            (status, body)
        }

        pub async fn post_json(&mut self, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
            self.post(path, "application/json", body).await
        }

        /// Sends `method` to `path` without a body; returns the status and the Allow header.
        #[allow(dead_code)]
        pub async fn bodiless(&mut self, method: &str, path: &str) -> (u16, Option<String>) {
            let req = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))
                .unwrap();
            self.sender.ready().await.expect("connection ready");
            let res = self.sender.send_request(req).await.expect("response");
            let allow = (res.headers().get("allow"))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let status = res.status().as_u16();
            res.into_body().collect().await.unwrap();
            (status, allow)
        }
    }
}

/// A GET over plain HTTP to the probe server.
pub async fn probe_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use http_body_util::{BodyExt, Empty};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", "localhost")
        .body(Empty::<hyper::body::Bytes>::new())
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}
