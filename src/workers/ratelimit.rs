//! A per-worker client rate limit (token bucket): QPS with a burst. The default is generous;
//! a low default capped a peer system at about 1.3 jobs/s.

use std::time::{Duration, Instant};
use tokio::sync::Mutex;

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
    fn reserve(
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

    /// Waits until the next request may go.
    pub async fn acquire(&self) {
        let wait = {
            let mut s = self.state.lock().await;
            let (tokens, last) = &mut *s;
            Self::reserve(tokens, last, self.qps, self.burst, Instant::now())
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_requests_are_spaced_at_the_rate() {
        let start = Instant::now();
        let (mut tokens, mut last) = (3.0, start);
        let waits: Vec<Duration> = (0..5)
            .map(|_| RateLimiter::reserve(&mut tokens, &mut last, 10.0, 3.0, start))
            .collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200));
        // After a quiet second the bucket is full again, never fuller than the burst.
        let later = start + Duration::from_secs(10);
        let w = RateLimiter::reserve(&mut tokens, &mut last, 10.0, 3.0, later);
        assert_eq!(w, Duration::ZERO);
        assert!(tokens <= 2.0 + f64::EPSILON);
    }
}
