//! `flashcore leakage`: the empirical timing-leakage test (docs/design.md §5), after dudect
//! (Reparaz, Balasch, Verbauwhede, DATE 2017).
//!
//! Two classes of inputs, one fixed (a corner case: zeros, ±max finite, subnormals, one-hot rows,
//! equal rows, extreme range; or, in secret-length mode, a fixed true length) and one random,
//! are launched in random order; each launch is timed with a pair of device events; Welch's t
//! test compares the classes on raw timings, on timings cropped at a ladder of percentiles, and
//! on centered squares (second order). |t| > 4.5 is a leak, |t| ≥ 10 a certain one. The test
//! counts only because it fails the deliberately leaky control kernels
//! ([`crate::kernels::LeakyControl`]).
//!
//! * [`stats`]: the statistics (online Welch, cropping, second order), GPU-free.
//! * [`classes`]: the fixed classes, GPU-free.
//! * [`decode`]: decode mode (the KV-cache call, secret key counts), GPU-free.
//! * [`run`]: the measurement loop on the device ([`run::Harness`]).
//! * [`report`]: the table and the JSON file.

pub mod classes;
pub mod cycles;
pub mod decode;
pub mod device;
pub mod report;
pub mod run;
pub mod stats;
pub mod verdict;

pub use classes::{FixedClass, LengthClass, ValueClass};
pub use decode::DecodeConfig;
pub use run::{ClassResult, CycleResult, Harness, LeakageConfig};
pub use stats::{Analysis, Class, Measurement, Verdict, Welch, Welford, CERTAIN_T, LEAK_T};
pub use verdict::{attribute, Attribution, Evidence};
