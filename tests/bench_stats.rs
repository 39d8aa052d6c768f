//! CPU tests of the bench statistics and FLOP counts.

use flashcore::bench::stats::{percentile, tflops, Stats};
use flashcore::AttentionParams;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn percentile_linear_interpolation_type7() {
    let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
    // numpy.percentile(x, p) (linear): rank (n-1)·p/100.
    assert!(close(percentile(&x, 0.0).unwrap(), 1.0));
    assert!(close(percentile(&x, 50.0).unwrap(), 5.5));
    assert!(close(percentile(&x, 95.0).unwrap(), 9.55));
    assert!(close(percentile(&x, 99.0).unwrap(), 9.91));
    assert!(close(percentile(&x, 100.0).unwrap(), 10.0));
    assert!(close(percentile(&x, 25.0).unwrap(), 3.25));
    // Odd count: the median is the middle sample.
    assert!(close(percentile(&[1.0, 3.0, 10.0], 50.0).unwrap(), 3.0));
    // One sample: every percentile is it.
    assert!(close(percentile(&[7.0], 99.0).unwrap(), 7.0));
    assert!(percentile(&[], 50.0).is_none());
    assert!(percentile(&x, 101.0).is_none());
    assert!(percentile(&x, -1.0).is_none());
    assert!(percentile(&x, f64::NAN).is_none());
}

#[test]
fn stats_of_known_samples() {
    // Unsorted on purpose. Sorted: 1,2,3,4,5,12; mean 4.5; squared deviations
    // 12.25+6.25+2.25+0.25+0.25+56.25 = 77.5, / (n−1) = 15.5.
    let s = Stats::from_samples(&[12.0, 3.0, 1.0, 5.0, 2.0, 4.0]).unwrap();
    assert_eq!(s.n, 6);
    assert!(close(s.min, 1.0));
    assert!(close(s.median, 3.5));
    assert!(close(s.mean, 4.5));
    assert!(close(s.p95, 10.25), "p95 {}", s.p95); // rank 4.75: 5 + 0.75·7
    assert!(close(s.p99, 11.65), "p99 {}", s.p99); // rank 4.95: 5 + 0.95·7
    assert!(close(s.max, 12.0));
    assert!(close(s.stddev, 15.5f64.sqrt()));
}

#[test]
fn stats_edge_cases() {
    assert!(Stats::from_samples(&[]).is_none());
    assert!(Stats::from_samples(&[1.0, f64::NAN]).is_none());
    assert!(Stats::from_samples(&[1.0, f64::INFINITY]).is_none());
    let one = Stats::from_samples(&[3.0]).unwrap();
    assert_eq!(
        (one.min, one.median, one.max, one.stddev),
        (3.0, 3.0, 3.0, 0.0)
    );
    let big: Vec<f64> = (1..=1000).map(f64::from).collect();
    let s = Stats::from_samples(&big).unwrap();
    assert!(close(s.median, 500.5));
    assert!(close(s.p99, 990.01)); // rank 989.01
    assert!(s.min <= s.median && s.median <= s.p95 && s.p95 <= s.p99 && s.p99 <= s.max);
}

#[test]
fn tflops_at_a_time() {
    // 1e12 FLOP in 1 s = 1 TFLOPS; 1e9 FLOP in 1 µs = 1000 TFLOPS.
    assert!(close(tflops(1e12, 1e6), 1.0));
    assert!(close(tflops(1e9, 1.0), 1000.0));
    assert!(tflops(1e9, 0.0).is_nan());
}

#[test]
fn flop_counts_halve_for_causal_only_when_square() {
    let p = AttentionParams::new(16, 16, 2048, 64);
    let full = 4.0 * 16.0 * 16.0 * 2048.0 * 2048.0 * 64.0;
    assert_eq!(p.flops(), full);
    assert_eq!(p.clone().causal(true).flops(), full / 2.0);
    // Sq ≠ Sk: bottom-right causal is not a triangle of the square; flash-attn counts it full.
    let rect = AttentionParams::new(1, 8, 512, 64).seqlen_k(1024);
    assert_eq!(rect.flops(), 4.0 * 8.0 * 512.0 * 1024.0 * 64.0);
    assert_eq!(rect.clone().causal(true).flops(), rect.flops());
    // Grouped heads count query heads.
    let mut gqa = AttentionParams::new(1, 32, 1024, 128);
    gqa.heads_kv = 8;
    assert_eq!(gqa.flops(), 4.0 * 32.0 * 1024.0 * 1024.0 * 128.0);
    // The anchors of docs/design.md §4: (16,16,2048,64) cuDNN non-causal 424 TFLOPS ⇔ ~324 µs.
    let us = full / 424e12 * 1e6;
    assert!(close(tflops(full, us), 424.0));
}
