//! The cycle timer's records (kernels/fc_instrument.cuh, `FC_CYCLE_TIMER=1`), read back after
//! each batch of launches and reduced to one number per launch. GPU-free and unit-tested.
//!
//! Each CTA writes a record of [`WORDS`] u64 words: its SM clock (`%clock64`) and the global
//! nanosecond timer (`%globaltimer`) at the start of the kernel body (thread 0), the SM id (word 2), and
//! for each consumer warp both readings after the warp's last store. The SM clock counts cycles
//! of that SM only, so a CTA's cycle count is `max(stop clocks) − start clock` on one SM; the
//! global timer is common to all SMs, so it also gives the launch's span on the device.
//!
//! Per launch:
//! * `cycles`: the mean over the launch's CTAs of their cycle counts — the number the test
//!   asks about: if the instruction stream, its branches or its memory accesses depended on the
//!   data, so would this count, whatever the clock;
//! * `span_ns`: the last stop minus the first start on the global timer (the kernel's time on
//!   the device, no launch overhead);
//! * `mhz`: the SM clock the CTAs ran at (cycles over nanoseconds, summed over CTAs) — where the
//!   time differs and the cycles do not, this says whether the clock moved.

use serde::{Deserialize, Serialize};

/// u64 words per CTA record (`FC_TIMER_WORDS`).
pub const WORDS: usize = 32;
/// Word offsets in a record (kernels/fc_instrument.cuh `FC_TIMER_*`); the stops are per consumer
/// warp, from these offsets on.
pub const START_CLOCK: usize = 0;
pub const START_NS: usize = 1;
pub const STOP_CLOCK: usize = 4;
pub const STOP_NS: usize = 16;
/// Most consumer warps a record has room for (3 consumer warpgroups).
pub const MAX_WARPS: usize = 12;

/// One launch, reduced.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LaunchCycles {
    /// Mean over CTAs of (last consumer warp's stop clock − start clock), SM cycles.
    pub cycles: f64,
    /// Largest CTA cycle count.
    pub max_cycles: u64,
    /// Last stop − first start, global timer nanoseconds.
    pub span_ns: u64,
    /// Σ cycles / Σ CTA nanoseconds · 1000: the SM clock in MHz. `None` when the global timer
    /// did not advance inside any CTA (it ticks in steps of tens of nanoseconds or more).
    pub mhz: Option<f64>,
}

/// Why a launch's records cannot be read: the instrumentation did not run as built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    WrongLength {
        words: usize,
        expected: usize,
    },
    NoCtas,
    TooManyWarps(usize),
    /// A CTA wrote no start record (zero start clock and timer).
    MissingStart {
        cta: usize,
    },
    /// A consumer warp wrote no stop, or a stop earlier than its CTA's start.
    BadStop {
        cta: usize,
        warp: usize,
    },
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::WrongLength { words, expected } => {
                write!(f, "{words} record words, expected {expected}")
            }
            RecordError::NoCtas => write!(f, "no CTA records"),
            RecordError::TooManyWarps(w) => {
                write!(f, "{w} consumer warps, a record holds {MAX_WARPS}")
            }
            RecordError::MissingStart { cta } => write!(f, "CTA {cta} wrote no start record"),
            RecordError::BadStop { cta, warp } => write!(
                f,
                "CTA {cta}, consumer warp {warp}: no stop record, or one before the start"
            ),
        }
    }
}

/// Reduces the records of one launch: `words` holds `ctas · WORDS` u64s, CTA by CTA (the
/// buffer is zeroed before each launch, so a record the kernel did not write is caught).
pub fn reduce(words: &[u64], ctas: usize, warps: usize) -> Result<LaunchCycles, RecordError> {
    if ctas == 0 {
        return Err(RecordError::NoCtas);
    }
    if warps == 0 || warps > MAX_WARPS {
        return Err(RecordError::TooManyWarps(warps));
    }
    if words.len() != ctas * WORDS {
        return Err(RecordError::WrongLength {
            words: words.len(),
            expected: ctas * WORDS,
        });
    }
    let (mut sum_cycles, mut max_cycles, mut sum_ns) = (0u128, 0u64, 0u128);
    let (mut first_ns, mut last_ns) = (u64::MAX, 0u64);
    for (cta, r) in words.chunks_exact(WORDS).enumerate() {
        let (c0, t0) = (r[START_CLOCK], r[START_NS]);
        if c0 == 0 && t0 == 0 {
            return Err(RecordError::MissingStart { cta });
        }
        let (mut c1, mut t1) = (0u64, 0u64);
        for w in 0..warps {
            let (c, t) = (r[STOP_CLOCK + w], r[STOP_NS + w]);
            if c < c0 || t < t0 || (c == 0 && t == 0) {
                return Err(RecordError::BadStop { cta, warp: w });
            }
            c1 = c1.max(c);
            t1 = t1.max(t);
        }
        let cycles = c1 - c0;
        sum_cycles += cycles as u128;
        max_cycles = max_cycles.max(cycles);
        sum_ns += (t1 - t0) as u128;
        first_ns = first_ns.min(t0);
        last_ns = last_ns.max(t1);
    }
    Ok(LaunchCycles {
        cycles: sum_cycles as f64 / ctas as f64,
        max_cycles,
        span_ns: last_ns - first_ns,
        mhz: (sum_ns > 0).then(|| sum_cycles as f64 / sum_ns as f64 * 1000.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record: start (clock, ns), then per warp (clock, ns) stops.
    fn record(c0: u64, t0: u64, stops: &[(u64, u64)]) -> Vec<u64> {
        let mut r = vec![0u64; WORDS];
        r[START_CLOCK] = c0;
        r[START_NS] = t0;
        for (w, &(c, t)) in stops.iter().enumerate() {
            r[STOP_CLOCK + w] = c;
            r[STOP_NS + w] = t;
        }
        r
    }

    #[test]
    fn reduces_ctas_by_their_own_clocks() {
        // Two SMs with unrelated clock origins; 2 GHz, 1.5 GHz.
        let mut w = record(1_000, 50_000, &[(21_000, 60_000), (20_000, 59_500)]);
        w.extend(record(
            9_000_000,
            50_100,
            &[(9_015_000, 60_100), (9_012_000, 60_000)],
        ));
        let l = reduce(&w, 2, 2).unwrap();
        assert_eq!(l.cycles, (20_000.0 + 15_000.0) / 2.0);
        assert_eq!(l.max_cycles, 20_000);
        assert_eq!(l.span_ns, 60_100 - 50_000);
        let mhz = l.mhz.unwrap();
        assert!((mhz - 35_000.0 / 20_000.0 * 1000.0).abs() < 1e-9, "{mhz}");
    }

    #[test]
    fn timer_that_did_not_tick_gives_no_clock() {
        let w = record(10, 100, &[(110, 100)]);
        let l = reduce(&w, 1, 1).unwrap();
        assert_eq!(l.cycles, 100.0);
        assert_eq!(l.mhz, None);
    }

    #[test]
    fn missing_or_bad_records_are_errors() {
        let good = record(10, 100, &[(20, 200)]);
        assert_eq!(
            reduce(&good, 1, 2),
            Err(RecordError::BadStop { cta: 0, warp: 1 })
        );
        let mut two = good.clone();
        two.extend(vec![0u64; WORDS]);
        assert_eq!(
            reduce(&two, 2, 1),
            Err(RecordError::MissingStart { cta: 1 })
        );
        let early = record(100, 100, &[(50, 200)]);
        assert_eq!(
            reduce(&early, 1, 1),
            Err(RecordError::BadStop { cta: 0, warp: 0 })
        );
        assert!(matches!(
            reduce(&good, 2, 1),
            Err(RecordError::WrongLength { .. })
        ));
        assert_eq!(reduce(&[], 0, 1), Err(RecordError::NoCtas));
        assert_eq!(reduce(&good, 1, 13), Err(RecordError::TooManyWarps(13)));
        assert!(!RecordError::NoCtas.to_string().is_empty());
    }
}
