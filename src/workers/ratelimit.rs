//! A per-worker client rate limit (token bucket): QPS with a burst. The default is generous;
//! a low default capped a peer system at about 1.3 jobs/s.
//!
//! [`RateLimitLayer`] puts the bucket in front of every request a worker's `kube::Client`
//! sends, and times each one for `switchyard_worker_request_duration_seconds`.

use prometheus_client::metrics::histogram::Histogram;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: qps.max(0.001),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// How long a request arriving at `now` must wait, taking its token.
    fn reserve_at(
        tokens: &mut f64,
        last: &mut Instant,
        qps: f64,
        burst: f64,
        now: Instant,
    ) -> Duration {
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * qps).min(burst);
        *last = now;
        *tokens -= 1.0;
        if *tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-*tokens / qps)
        }
    }

    /// Takes a token now; returns how long the request must wait before it goes.
    pub(crate) fn reserve(&self) -> Duration {
        // A poisoned lock only means another request panicked mid-update; the numbers are
        // still usable.
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, last) = &mut *s;
        Self::reserve_at(tokens, last, self.qps, self.burst, Instant::now())
    }
}

/// Throttles every request of the service it wraps through one [`RateLimiter`], and records
/// each request's latency (until the response headers) in `latency` when given.
#[derive(Clone)]
pub(crate) struct RateLimitLayer {
    limiter: Arc<RateLimiter>,
    latency: Option<Histogram>,
}

impl RateLimitLayer {
    pub(crate) fn new(limiter: Arc<RateLimiter>, latency: Option<Histogram>) -> Self {
        Self { limiter, latency }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            latency: self.latency.clone(),
            wait: None,
            granted: false,
        }
    }
}

/// The service [`RateLimitLayer`] makes. The wait happens in `poll_ready`: kube's client
/// drives its stack from one buffer task, so requests leave in order and a slow bucket holds
/// back only this worker's requests.
pub(crate) struct RateLimited<S> {
    inner: S,
    limiter: Arc<RateLimiter>,
    latency: Option<Histogram>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    granted: bool,
}

impl<S, R> tower::Service<R> for RateLimited<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.granted {
            if self.wait.is_none() {
                let wait = self.limiter.reserve();
                if wait.is_zero() {
                    self.granted = true;
                } else {
                    self.wait = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
            if let Some(sleep) = self.wait.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
                self.granted = true;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.granted = false;
        let started = Instant::now();
        let latency = self.latency.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            if let Some(h) = latency {
                h.observe(started.elapsed().as_secs_f64());
            }
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    #[test]
    fn a_burst_passes_then_requests_are_spaced_at_the_rate() {
        let start = Instant::now();
        let (mut tokens, mut last) = (3.0, start);
        let waits: Vec<Duration> = (0..5)
            .map(|_| RateLimiter::reserve_at(&mut tokens, &mut last, 10.0, 3.0, start))
            .collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200));
        // After a quiet second the bucket is full again, never fuller than the burst.
        let later = start + Duration::from_secs(10);
        let w = RateLimiter::reserve_at(&mut tokens, &mut last, 10.0, 3.0, later);
        assert_eq!(w, Duration::ZERO);
        assert!(tokens <= 2.0 + f64::EPSILON);
    }

    #[tokio::test]
    async fn the_layer_holds_each_request_until_its_token() {
        let limiter = Arc::new(RateLimiter::new(20.0, 2));
        let layer = RateLimitLayer::new(limiter, Some(Histogram::new([0.1, 1.0].into_iter())));
        let mut svc = tower::Layer::layer(
            &layer,
            tower::service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) }),
        );
        let start = Instant::now();
        for i in 0..5u32 {
            let out = svc.ready().await.unwrap().call(i).await.unwrap();
            assert_eq!(out, i);
        }
        // Two pass at once, the next three wait 50 ms each.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(145), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    }
}
