//! Handler-only cost of one admission review: body bytes in, reply body out, through
//! `admission::review_body` (parse, decide, render). No HTTP, no TLS, one thread.
//!
//! Target: a typical defaulted Job review (~4 KB) under 20 µs.
//!
//!     cargo bench --bench admission
//!
//! Each case is measured twice: on the capture as stored (pretty-printed, as the fixtures
//! keep it) and on the same JSON compacted, which is what kube-apiserver actually sends
//! (Go's encoding/json writes no whitespace).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;
use switchyard::webhook::{review_body, AdmissionPolicy, Hook};

struct Case {
    group: &'static str,
    fixture: &'static str,
    hook: Hook,
    /// The decision the fixture must produce, so the bench cannot silently measure an error
    /// path (an unreadable body is much cheaper than a real review).
    outcome: &'static str,
}

const CASES: &[Case] = &[
    Case {
        group: "mutate CREATE",
        fixture: "admission-mutate-create-basic",
        hook: Hook::Mutate,
        outcome: "patched",
    },
    Case {
        group: "validate CREATE",
        fixture: "validate-create-mutated",
        hook: Hook::Validate,
        outcome: "allowed",
    },
    Case {
        group: "validate UPDATE",
        fixture: "validate-update-unsuspend-alice-managed",
        hook: Hook::Validate,
        outcome: "denied",
    },
];

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/admission")
        .join(format!("{name}.json"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn compact(body: &[u8]) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_slice(body).expect("fixture is JSON");
    serde_json::to_vec(&value).expect("re-serialise fixture")
}

fn reviews(c: &mut Criterion) {
    switchyard::install_crypto_provider();
    let policy = AdmissionPolicy::default();
    for case in CASES {
        let stored = fixture(case.fixture);
        let variants = [("as stored", stored.clone()), ("compact", compact(&stored))];

        let mut group = c.benchmark_group(case.group);
        for (label, body) in &variants {
            let (reply, decision) = review_body(case.hook, body, &policy, None)
                .unwrap_or_else(|e| panic!("{}: {e:?}", case.fixture));
            assert_eq!(
                decision.outcome(),
                case.outcome,
                "{} ({label}) decided differently than expected; reply: {}",
                case.fixture,
                String::from_utf8_lossy(&reply)
            );

            group.throughput(Throughput::Bytes(body.len() as u64));
            group.bench_function(format!("{} ({} B)", label, body.len()), |b| {
                b.iter(|| {
                    review_body(case.hook, black_box(body), &policy, None)
                        .expect("review")
                        .0
                })
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    // Modest times so the whole run stays under a minute: 3 cases x 2 variants x ~4.5 s.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = reviews
}
criterion_main!(benches);
