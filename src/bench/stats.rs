//! Summary statistics of timing samples.
//!
//! Percentiles use **linear interpolation between closest ranks** (Hyndman & Fan type 7, the
//! default of NumPy's `percentile` and of R's `quantile`): for `n` sorted samples `x[0..n]` and
//! `p` in [0, 100], the rank is `h = (n − 1) · p / 100` and the value is
//! `x[⌊h⌋] + (h − ⌊h⌋) · (x[⌊h⌋ + 1] − x[⌊h⌋])`. The median is the 50th percentile (for even `n`
//! the mean of the two middle samples). `bench/sdpa.py` implements the same formulas.

use serde::{Deserialize, Serialize};

/// Statistics of one set of samples (microseconds in every record flashcore writes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of samples.
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub mean: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    /// Sample standard deviation (divisor n − 1; 0 for a single sample).
    pub stddev: f64,
}

/// The `p`-th percentile (0 ≤ p ≤ 100) of ascending `sorted` samples, by linear interpolation
/// between closest ranks (type 7). `None` for no samples or a `p` out of range / NaN.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let h = (sorted.len() - 1) as f64 * p / 100.0;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let frac = h - lo as f64;
    Some(sorted[lo] + frac * (sorted[hi] - sorted[lo]))
}

impl Stats {
    /// Statistics of `samples` (any order). `None` when empty or when a sample is not finite.
    pub fn from_samples(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let mean = s.iter().sum::<f64>() / n as f64;
        let stddev = if n > 1 {
            (s.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Stats {
            n,
            min: s[0],
            median: percentile(&s, 50.0)?,
            mean,
            p95: percentile(&s, 95.0)?,
            p99: percentile(&s, 99.0)?,
            max: s[n - 1],
            stddev,
        })
    }
}

/// Throughput in TFLOPS of `flops` floating-point operations done in `time_us` microseconds.
pub fn tflops(flops: f64, time_us: f64) -> f64 {
    if time_us > 0.0 {
        flops / (time_us * 1e-6) / 1e12
    } else {
        f64::NAN
    }
}
