//! The leakage test's statistics on the CPU with known samples: Welford, Welch's t against a
//! hand-computed value, the cropping ladder, the power of cropping against heavy tails, the
//! second-order test, verdicts.

use flashcore::leakage::stats::{
    analyze, crop_percentiles, crop_thresholds, Class, Measurement, Verdict, Welch, Welford, CROPS,
    LEAK_T,
};
use rand::{Rng, SeedableRng};

fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(1e-300);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// `n` measurements, each class drawn at random, the timing from `gen(class, rng)`.
fn sample(
    n: usize,
    seed: u64,
    mut gen: impl FnMut(Class, &mut rand::rngs::StdRng) -> f64,
) -> Vec<Measurement> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let class = if rng.random::<bool>() {
                Class::Fixed
            } else {
                Class::Random
            };
            Measurement {
                class,
                time_us: gen(class, &mut rng),
            }
        })
        .collect()
}

#[test]
fn welford_matches_two_pass() {
    let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
    let mut w = Welford::new();
    xs.iter().for_each(|&x| w.push(x));
    assert_eq!(w.n(), 8);
    assert!((w.mean() - 5.0).abs() < 1e-15);
    assert!((w.variance() - 32.0 / 7.0).abs() < 1e-13);
    assert_eq!(Welford::new().variance(), 0.0);
}

#[test]
fn welford_is_stable_at_a_large_offset() {
    // The textbook sum-of-squares formula loses every digit here; Welford keeps them.
    let mut w = Welford::new();
    for x in [4.0, 7.0, 13.0, 16.0] {
        w.push(1e9 + x);
    }
    assert!((w.mean() - (1e9 + 10.0)).abs() < 1e-6);
    assert!((w.variance() - 30.0).abs() < 1e-6, "{}", w.variance());
}

#[test]
fn welch_matches_hand_computed_t() {
    // a = 1..=10: mean 5.5, variance 55/6; b = 0,2,0,2,… (20): mean 1, variance 20/19.
    // t = 4.5 / sqrt(55/60 + 1/19) = 4.570711401404832.
    let mut w = Welch::new();
    for x in 1..=10 {
        w.push(Class::Fixed, x as f64);
    }
    for i in 0..20 {
        w.push(Class::Random, if i % 2 == 0 { 0.0 } else { 2.0 });
    }
    let t = w.t().unwrap();
    assert!((t - 4.570711401404832).abs() < 1e-12, "{t}");
    assert_eq!(w.n(), 30);
    // Swapping the classes flips the sign.
    let mut s = Welch::new();
    for x in 1..=10 {
        s.push(Class::Random, x as f64);
    }
    for i in 0..20 {
        s.push(Class::Fixed, if i % 2 == 0 { 0.0 } else { 2.0 });
    }
    assert!((s.t().unwrap() + t).abs() < 1e-12);
}

#[test]
fn welch_edge_cases() {
    let mut w = Welch::new();
    for _ in 0..9 {
        w.push(Class::Fixed, 1.0);
        w.push(Class::Random, 1.0);
    }
    assert_eq!(w.t(), None, "too few per class");
    w.push(Class::Fixed, 1.0);
    w.push(Class::Random, 1.0);
    assert_eq!(w.t(), Some(0.0), "no spread, equal means");
    let mut d = Welch::new();
    for _ in 0..10 {
        d.push(Class::Fixed, 1.0);
        d.push(Class::Random, 2.0);
    }
    assert_eq!(d.t(), Some(f64::NEG_INFINITY), "no spread, different means");
}

#[test]
fn cropping_ladder() {
    let p = crop_percentiles(CROPS);
    assert_eq!(p.len(), 100);
    assert!((p[0] - 6.696700846319259).abs() < 1e-9, "{}", p[0]);
    assert!((p[1] - 12.944943670387588).abs() < 1e-9);
    assert!((p[99] - 99.90234375).abs() < 1e-9, "1 − 2^−10");
    assert!(p.windows(2).all(|w| w[0] < w[1]));
    assert!(p.iter().all(|&x| x > 0.0 && x < 100.0));
    // Thresholds from pooled timings 0, 1, …, 1000: percentile p is p·10.
    let pooled: Vec<f64> = (0..=1000).map(f64::from).collect();
    let th = crop_thresholds(&pooled, &p);
    assert_eq!(th.len(), 100);
    for (t, q) in th.iter().zip(&p) {
        assert!((t - q * 10.0).abs() < 1e-9, "{t} vs {q}");
    }
    assert!(crop_thresholds(&[], &p).is_empty());
}

#[test]
fn identical_distributions_give_small_t() {
    // A realistic timing shape: a narrow body, quantised, with a rare long tail.
    let m = sample(100_000, 1, |_, rng| {
        let body = 10.0 + 0.05 * normal(rng);
        let tail = if rng.random::<f64>() < 0.01 {
            50.0 * rng.random::<f64>()
        } else {
            0.0
        };
        ((body + tail) * 32.0).round() / 32.0
    });
    let a = analyze(&m, CROPS);
    let t = a.max_abs_t().unwrap();
    assert!(t < LEAK_T, "max |t| {t} for identical classes: {a:?}");
    assert_eq!(a.verdict(), Verdict::NoLeak);
    assert_eq!(a.n[0] + a.n[1], 100_000);
    assert!(a.tests > 150, "raw + cropped + second order: {}", a.tests);
}

#[test]
fn shifted_means_give_large_t() {
    let m = sample(100_000, 2, |c, rng| {
        10.0 + normal(rng) + if c == Class::Fixed { 0.1 } else { 0.0 }
    });
    let a = analyze(&m, CROPS);
    // Expected t ≈ 0.1 / sqrt(2 / 50000) ≈ 15.8.
    let raw = a.raw.unwrap().t;
    assert!(raw > 10.0 && raw < 22.0, "raw t {raw}");
    assert_eq!(a.verdict(), Verdict::CertainLeak);
}

#[test]
fn cropping_finds_a_shift_hidden_by_outliers() {
    // A 0.02 µs shift in the body, 1 % outliers of 1000 µs in both classes: the raw test is
    // swamped, the cropped ones are not.
    let m = sample(100_000, 3, |c, rng| {
        if rng.random::<f64>() < 0.01 {
            1000.0 + rng.random::<f64>()
        } else {
            10.0 + 0.1 * normal(rng) + if c == Class::Fixed { 0.02 } else { 0.0 }
        }
    });
    let a = analyze(&m, CROPS);
    let raw = a.raw.unwrap().t.abs();
    let cropped = a.cropped.unwrap();
    assert!(raw < LEAK_T, "raw |t| {raw}");
    assert!(cropped.t.abs() > 10.0, "cropped {cropped:?}");
    assert!(cropped.crop_percentile.unwrap() < 99.0);
    assert!(a.verdict().is_leak());
}

#[test]
fn second_order_finds_a_variance_difference() {
    // Equal means, standard deviations 1 and 1.5 (symmetric distributions).
    let m = sample(100_000, 4, |c, rng| {
        10.0 + normal(rng) * if c == Class::Fixed { 1.0 } else { 1.5 }
    });
    let a = analyze(&m, CROPS);
    let raw = a.raw.unwrap().t.abs();
    assert!(raw < LEAK_T, "first-order raw |t| {raw} with equal means");
    let so = a.second_order.unwrap();
    assert!(so.t.abs() > 10.0, "second order {so:?}");
    // The fixed class has the smaller spread: negative t.
    assert!(so.t < 0.0);
    // And no false alarm with equal spreads.
    let same = analyze(&sample(100_000, 5, |_, rng| 10.0 + normal(rng)), CROPS);
    assert!(same.second_order.unwrap().t.abs() < LEAK_T, "{same:?}");
}

#[test]
fn verdict_thresholds() {
    assert_eq!(Verdict::from_t(0.0), Verdict::NoLeak);
    assert_eq!(Verdict::from_t(4.5), Verdict::NoLeak);
    assert_eq!(Verdict::from_t(4.51), Verdict::Leak);
    assert_eq!(Verdict::from_t(9.99), Verdict::Leak);
    assert_eq!(Verdict::from_t(10.0), Verdict::CertainLeak);
    assert_eq!(Verdict::from_t(f64::INFINITY), Verdict::CertainLeak);
    assert!(!Verdict::NoLeak.is_leak() && Verdict::Leak.is_leak());
    // Too few measurements: no test at all.
    let few = sample(12, 6, |_, _| 1.0);
    assert_eq!(analyze(&few, CROPS).verdict(), Verdict::Inconclusive);
}
