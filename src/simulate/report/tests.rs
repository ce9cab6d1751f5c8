use super::*;
use serde_json::json;

fn spread(values: &[f64]) -> Value {
    let s = Spread::of(values.to_vec());
    json!([s.mean, s.p50, s.p95, s.max])
}

#[test]
fn percentiles_are_nearest_rank() {
    // 1..=20: the 50th percentile is the 10th value, the 95th the 19th.
    let twenty: Vec<f64> = (1..=20).rev().map(f64::from).collect();
    assert_eq!(spread(&twenty), json!([10.5, 10, 19, 20]));
    // 1..=100: the 95th value.
    let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(spread(&hundred), json!([50.5, 50, 95, 100]));
    // One value is every percentile; two: p50 is the first.
    assert_eq!(spread(&[7.25]), json!([7.25, 7.25, 7.25, 7.25]));
    assert_eq!(spread(&[30.0, 10.0]), json!([20, 10, 30, 30]));
    assert_eq!(spread(&[1.0 / 3.0]), json!([0.333, 0.333, 0.333, 0.333]));
    assert_eq!(spread(&[]), json!([null, null, null, null]));
}

#[test]
fn extended_resources_name_kinds_and_bytes_are_counted_in_gib() {
    for r in ["nvidia.com/gpu", "example.com/fpga", "rdma/hca"] {
        assert!(is_extended(r), "{r}");
    }
    for r in [
        "cpu",
        "memory",
        "ephemeral-storage",
        "pods",
        "hugepages-2Mi",
        "hugepages-1Gi",
    ] {
        assert!(!is_extended(r), "{r}");
    }
    let gib = 1000 * (1i64 << 30);
    assert_eq!(resource_hours("memory", 4 * gib, 1800.0), 2.0);
    assert_eq!(resource_hours("hugepages-1Gi", 2 * gib, 3600.0), 2.0);
    assert_eq!(resource_hours("cpu", 500, 7200.0), 1.0);
    assert_eq!(resource_hours("nvidia.com/gpu", 2000, 900.0), 0.5);
}
