//! What a Kubernetes Service gives the API server and kube-scheduler in front of Switchyard's
//! replicas: one address that reaches whichever replica is up. A TCP relay on loopback that
//! takes the replicas in turn and skips one that refuses the connection (TLS goes through
//! untouched, so the serving certificate must name 127.0.0.1).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

pub struct Service {
    pub addr: SocketAddr,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Service {
    pub async fn start() -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("service: cannot listen on loopback: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let backends: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
        let next = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let backends = backends.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let candidates = backends.lock().unwrap().clone();
                    let first = next.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(relay(inbound, candidates, first));
                }
            }
        });
        Ok(Self {
            addr,
            backends,
            task,
        })
    }

    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        *self.backends.lock().unwrap() = backends;
    }
}

async fn relay(mut inbound: TcpStream, candidates: Vec<SocketAddr>, first: usize) {
    for i in 0..candidates.len() {
        let backend = candidates[(first + i) % candidates.len()];
        let connect = TcpStream::connect(backend);
        if let Ok(Ok(mut outbound)) = tokio::time::timeout(Duration::from_secs(2), connect).await {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            return;
        }
    }
    // No replica answers: the caller sees the connection close, as with a Service without
    // ready endpoints.
}

impl Drop for Service {
    fn drop(&mut self) {
        self.task.abort();
    }
}
