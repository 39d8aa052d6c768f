//! The statistics of the dudect test (Reparaz, Balasch, Verbauwhede, "Dude, is my code constant
//! time?", DATE 2017), GPU-free and unit-tested on the CPU.
//!
//! * [`Welford`]: running mean and variance, numerically stable (Welford 1962); [`Welch`]: one
//!   per class, and Welch's t statistic between them.
//! * [`crop_percentiles`] / [`crop_thresholds`]: dudect's cropping ladder. Heavy upper tails
//!   (preemption, interrupts, clock changes) hide small shifts; the test is repeated on the
//!   timings at or below each of a ladder of thresholds taken from the pooled distribution.
//! * [`analyze`]: every test on a set of measurements: raw, cropped at each threshold, and second
//!   order (Welch's t on the squared deviation of each timing from its class mean, which finds a
//!   difference in spread when the means agree), raw and at each threshold.

use crate::bench::stats::percentile;
use serde::{Deserialize, Serialize};

/// |t| above this is a leak.
pub const LEAK_T: f64 = 4.5;
/// |t| at or above this is a certain leak.
pub const CERTAIN_T: f64 = 10.0;
/// Default number of cropping thresholds (as dudect).
pub const CROPS: usize = 100;
/// A test is made only when each class has at least this many measurements in it.
pub const MIN_PER_CLASS: u64 = 10;

/// The two input classes of a dudect test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Fixed,
    Random,
}

impl Class {
    pub fn index(self) -> usize {
        match self {
            Class::Fixed => 0,
            Class::Random => 1,
        }
    }
}

/// One timed launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    pub class: Class,
    /// Device time in microseconds.
    pub time_us: f64,
}

/// Running count, mean and sum of squared deviations (Welford's update).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Welford {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, x: f64) {
        self.n += 1;
        let delta = x - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (x - self.mean);
    }
    pub fn n(&self) -> u64 {
        self.n
    }
    pub fn mean(&self) -> f64 {
        self.mean
    }
    /// Sample variance (divisor n − 1); 0 for fewer than two samples.
    pub fn variance(&self) -> f64 {
        if self.n < 2 {
            0.0
        } else {
            (self.m2 / (self.n - 1) as f64).max(0.0)
        }
    }
}

/// Welch's t statistic between two classes, accumulated online.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Welch {
    classes: [Welford; 2],
}

impl Welch {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, class: Class, x: f64) {
        self.classes[class.index()].push(x);
    }
    pub fn class(&self, class: Class) -> &Welford {
        &self.classes[class.index()]
    }
    /// Measurements of both classes together.
    pub fn n(&self) -> u64 {
        self.classes[0].n() + self.classes[1].n()
    }
    /// t = (mean_fixed − mean_random) / sqrt(var_fixed / n_fixed + var_random / n_random).
    /// `None` when a class has fewer than [`MIN_PER_CLASS`] measurements. When both variances
    /// are zero, t is 0 for equal means and ±∞ otherwise.
    pub fn t(&self) -> Option<f64> {
        let [a, b] = &self.classes;
        if a.n() < MIN_PER_CLASS || b.n() < MIN_PER_CLASS {
            return None;
        }
        let diff = a.mean() - b.mean();
        let se2 = a.variance() / a.n() as f64 + b.variance() / b.n() as f64;
        if se2 > 0.0 {
            Some(diff / se2.sqrt())
        } else if diff == 0.0 {
            Some(0.0)
        } else {
            Some(diff.signum() * f64::INFINITY)
        }
    }
}

/// dudect's cropping ladder, as percentiles in [0, 100): `100 · (1 − 0.5^(10·(i+1)/count))` for
/// i = 0 … count − 1 (for count = 100: 6.7, 12.9, …, 99.9). Dense near the top of the
/// distribution, where the tail that hides a shift begins.
pub fn crop_percentiles(count: usize) -> Vec<f64> {
    (0..count)
        .map(|i| 100.0 * (1.0 - 0.5f64.powf(10.0 * (i + 1) as f64 / count as f64)))
        .collect()
}

/// The timing threshold of each percentile in `percentiles`, from ascending pooled timings
/// (linear-interpolation percentiles, as `flashcore bench`). Empty when there are no timings.
pub fn crop_thresholds(sorted_pooled: &[f64], percentiles: &[f64]) -> Vec<f64> {
    percentiles
        .iter()
        .filter_map(|&p| percentile(sorted_pooled, p))
        .collect()
}

/// One test's outcome: which test, how many measurements entered it, and t.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    /// Timings at or below this pooled percentile entered the test (None: all of them).
    pub crop_percentile: Option<f64>,
    /// Measurements (both classes) in the test.
    pub n: u64,
    /// Welch's t (may be ±∞ when both classes have no spread; null in JSON then).
    pub t: f64,
}

/// Every test on one set of measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// Measurements per class: [fixed, random].
    pub n: [u64; 2],
    /// First order, all timings.
    pub raw: Option<TestResult>,
    /// First order, cropped: the largest |t| of the ladder.
    pub cropped: Option<TestResult>,
    /// Second order (centered squares), raw and cropped: the largest |t| of them.
    pub second_order: Option<TestResult>,
    /// Tests made (ones with too few measurements in a class are not made).
    pub tests: usize,
}

fn max_abs(a: Option<TestResult>, b: TestResult) -> Option<TestResult> {
    match a {
        Some(a) if b.t.abs() <= a.t.abs() => Some(a),
        _ => Some(b),
    }
}

impl Analysis {
    /// The largest |t| over every test made; `None` when none was made.
    pub fn max_abs_t(&self) -> Option<f64> {
        [self.raw, self.cropped, self.second_order]
            .iter()
            .flatten()
            .map(|r| r.t.abs())
            .reduce(f64::max)
    }
    pub fn verdict(&self) -> Verdict {
        match self.max_abs_t() {
            None => Verdict::Inconclusive,
            Some(t) => Verdict::from_t(t),
        }
    }
}

/// What max |t| says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// |t| ≤ 4.5: no leak found at this number of measurements.
    NoLeak,
    /// 4.5 < |t| < 10.
    Leak,
    /// |t| ≥ 10.
    CertainLeak,
    /// Too few measurements in a class for any test.
    Inconclusive,
}

impl Verdict {
    pub fn from_t(abs_t: f64) -> Verdict {
        if abs_t >= CERTAIN_T {
            Verdict::CertainLeak
        } else if abs_t > LEAK_T {
            Verdict::Leak
        } else {
            Verdict::NoLeak
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Verdict::NoLeak => "no leak",
            Verdict::Leak => "LEAK",
            Verdict::CertainLeak => "CERTAIN LEAK",
            Verdict::Inconclusive => "inconclusive",
        }
    }
    pub fn is_leak(self) -> bool {
        matches!(self, Verdict::Leak | Verdict::CertainLeak)
    }
}

/// Second-order test on the measurements that pass `keep`: Welch's t between the classes of
/// (x − mean of x's class)², the means taken over the kept measurements.
fn second_order(m: &[Measurement], keep: impl Fn(f64) -> bool) -> Welch {
    let mut first = Welch::new();
    for x in m.iter().filter(|x| keep(x.time_us)) {
        first.push(x.class, x.time_us);
    }
    let means = [
        first.class(Class::Fixed).mean(),
        first.class(Class::Random).mean(),
    ];
    let mut second = Welch::new();
    for x in m.iter().filter(|x| keep(x.time_us)) {
        let d = x.time_us - means[x.class.index()];
        second.push(x.class, d * d);
    }
    second
}

fn result(w: &Welch, crop_percentile: Option<f64>) -> Option<TestResult> {
    w.t().map(|t| TestResult {
        crop_percentile,
        n: w.n(),
        t,
    })
}

/// Runs every test on `m` with a ladder of `crops` thresholds (see [`crop_percentiles`]) from the
/// pooled timings. A measurement enters a cropped test when its timing is at or below the
/// threshold (timings are quantised, so ties at the threshold are kept).
pub fn analyze(m: &[Measurement], crops: usize) -> Analysis {
    let mut raw = Welch::new();
    for x in m {
        raw.push(x.class, x.time_us);
    }
    let mut pooled: Vec<f64> = m.iter().map(|x| x.time_us).collect();
    pooled.sort_by(f64::total_cmp);
    let pcts = crop_percentiles(crops);
    let thresholds = crop_thresholds(&pooled, &pcts);

    let mut cropped = vec![Welch::new(); thresholds.len()];
    // Thresholds ascend, so a timing enters every test from the first threshold it is ≤ to.
    for x in m {
        let first = thresholds.partition_point(|&th| th < x.time_us);
        for w in &mut cropped[first..] {
            w.push(x.class, x.time_us);
        }
    }

    let mut a = Analysis {
        n: [raw.class(Class::Fixed).n(), raw.class(Class::Random).n()],
        raw: result(&raw, None),
        cropped: None,
        second_order: None,
        tests: 0,
    };
    a.tests += a.raw.is_some() as usize;
    for (w, &p) in cropped.iter().zip(&pcts) {
        if let Some(r) = result(w, Some(p)) {
            a.tests += 1;
            a.cropped = max_abs(a.cropped, r);
        }
    }
    let so_raw = second_order(m, |_| true);
    if let Some(r) = result(&so_raw, None) {
        a.tests += 1;
        a.second_order = max_abs(a.second_order, r);
    }
    for (&th, &p) in thresholds.iter().zip(&pcts) {
        if let Some(r) = result(&second_order(m, |x| x <= th), Some(p)) {
            a.tests += 1;
            a.second_order = max_abs(a.second_order, r);
        }
    }
    a
}
