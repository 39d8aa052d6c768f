//! Where a launch's time goes: the cycle-timer build of the shape's kernel
//! (kernels/fc_instrument.cuh) marks, per CTA, the SM clock at the start, once the barriers are
//! initialised, when the first consumer thread has its Q tile, its first scores and its last
//! P V, and when each consumer warp has stored its output; and the global timer at the start and
//! the end. A persistent CTA that walks several tiles sums each phase over its tiles (the marks
//! are laid end to end: fc_instrument.cuh), and counts them; the report gives both the sums and
//! the sums divided by the median tile count. `flashcore bench --phases` launches it on rotating
//! random inputs (cold L2, as the bench times) and reports the median of each phase over CTAs and
//! launches, and the span from the first CTA's start to the last CTA's end.
//!
//! The record layout is the cycle timer's (`src/leakage/cycles.rs`); the phase words are
//! `FC_PHASE_*` in kernels/fc_instrument.cuh.

use super::device::random_bits;
use super::stats::Stats;
use crate::attention::{AttentionParams, Context};
use crate::error::{Error, Result};
use crate::kernels::TestBuild;
use crate::leakage::cycles::{START_CLOCK, START_NS, STOP_CLOCK, STOP_NS, WORDS};
use crate::leakage::device::CycleTimer;

// The phase words of a record (kernels/fc_instrument.cuh `FC_PHASE_*`).
const PHASE_INIT: usize = 3;
const PHASE_Q: usize = 28;
const PHASE_S0: usize = 29;
const PHASE_LOOP: usize = 30;
const PHASE_TILES: usize = 31;

/// The phases, in order, each from the previous mark to its own.
pub const PHASES: [&str; 5] = [
    "start → barriers initialised",
    "→ Q tile arrived (first TMA from memory)",
    "→ first scores (Q Kᵀ of block 0)",
    "→ last P V done (main loop)",
    "→ output stored (epilogue)",
];

/// One CTA's marks: the five phase lengths in SM cycles (each summed over the CTA's tiles), its
/// tile count, and its start and end in global-timer nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CtaPhases {
    pub cycles: [u64; 5],
    pub tiles: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Reads one CTA's record; `None` when a mark is missing or out of order (a CTA with no tile,
/// or one whose only tile had no visible key, never reaches the Q and score marks).
pub fn cta_phases(r: &[u64], warps: usize) -> Option<CtaPhases> {
    let stop_clock = (0..warps).map(|w| r[STOP_CLOCK + w]).max()?;
    let end_ns = (0..warps).map(|w| r[STOP_NS + w]).max()?;
    let marks = [
        r[START_CLOCK],
        r[PHASE_INIT],
        r[PHASE_Q],
        r[PHASE_S0],
        r[PHASE_LOOP],
        stop_clock,
    ];
    if marks.contains(&0) || marks.windows(2).any(|w| w[1] < w[0]) {
        return None;
    }
    let mut cycles = [0u64; 5];
    for (i, c) in cycles.iter_mut().enumerate() {
        *c = marks[i + 1] - marks[i];
    }
    Some(CtaPhases {
        cycles,
        tiles: r[PHASE_TILES].max(1),
        start_ns: r[START_NS],
        end_ns,
    })
}

/// The breakdown over many launches.
#[derive(Debug, Clone)]
pub struct PhaseReport {
    pub variant: String,
    pub ctas: usize,
    pub launches: usize,
    /// Per phase: the per-launch median over CTAs, summarised over launches.
    pub phases: Vec<Stats>,
    /// Per launch: the median CTA's tile count.
    pub tiles: Stats,
    /// Per launch: SM cycles from start to end, median CTA and slowest CTA.
    pub total_median_cta: Stats,
    pub total_max_cta: Stats,
    /// Per launch: first CTA start to last CTA end (ns), and the spread of CTA starts (ns).
    pub span_ns: Stats,
    pub start_skew_ns: Stats,
    /// SM clock (MHz) over all CTAs of all launches.
    pub mhz: f64,
}

fn median_u64(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0
    }
}

/// Reduces the records of `launches.len()` launches (each `ctas · WORDS` words).
pub fn reduce(
    variant: String,
    launches: &[Vec<u64>],
    ctas: usize,
    warps: usize,
) -> Result<PhaseReport> {
    let mut per_phase: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
    let (mut tot_med, mut tot_max, mut span, mut skew) = (vec![], vec![], vec![], vec![]);
    let mut tiles = vec![];
    let (mut sum_cycles, mut sum_ns) = (0u128, 0u128);
    for words in launches {
        let ctas_ok: Vec<CtaPhases> = words
            .chunks_exact(WORDS)
            .take(ctas)
            .filter_map(|r| cta_phases(r, warps))
            .collect();
        if ctas_ok.is_empty() {
            return Err(Error::Other(
                "phase timer: no CTA wrote a complete record".into(),
            ));
        }
        for (i, list) in per_phase.iter_mut().enumerate() {
            let mut v: Vec<u64> = ctas_ok.iter().map(|c| c.cycles[i]).collect();
            list.push(median_u64(&mut v));
        }
        let mut t: Vec<u64> = ctas_ok.iter().map(|c| c.tiles).collect();
        tiles.push(median_u64(&mut t));
        let mut totals: Vec<u64> = ctas_ok.iter().map(|c| c.cycles.iter().sum()).collect();
        tot_max.push(*totals.iter().max().expect("non-empty") as f64);
        tot_med.push(median_u64(&mut totals));
        let first = ctas_ok.iter().map(|c| c.start_ns).min().expect("non-empty");
        let last_start = ctas_ok.iter().map(|c| c.start_ns).max().expect("non-empty");
        let last = ctas_ok.iter().map(|c| c.end_ns).max().expect("non-empty");
        span.push(last.saturating_sub(first) as f64);
        skew.push((last_start - first) as f64);
        for c in &ctas_ok {
            sum_cycles += c.cycles.iter().sum::<u64>() as u128;
            sum_ns += c.end_ns.saturating_sub(c.start_ns) as u128;
        }
    }
    let summary =
        |v: &[f64]| Stats::from_samples(v).ok_or_else(|| Error::Other("no launches".into()));
    Ok(PhaseReport {
        variant,
        ctas,
        launches: launches.len(),
        phases: per_phase
            .iter()
            .map(|v| summary(v))
            .collect::<Result<_>>()?,
        tiles: summary(&tiles)?,
        total_median_cta: summary(&tot_med)?,
        total_max_cta: summary(&tot_max)?,
        span_ns: summary(&span)?,
        start_skew_ns: summary(&skew)?,
        mhz: if sum_ns > 0 {
            sum_cycles as f64 / sum_ns as f64 * 1000.0
        } else {
            0.0
        },
    })
}

/// Launches the cycle-timer build of `params`' kernel `launches` times, rotating over `sets`
/// random input sets, one launch at a time (each synchronised and read back).
pub fn measure(
    ctx: &Context,
    params: &AttentionParams,
    launches: usize,
    sets: usize,
) -> Result<PhaseReport> {
    let build = TestBuild {
        cycle_timer: true,
        ..TestBuild::default()
    };
    let plan = ctx.plan_build(params, false, build)?;
    let variant = plan.variant();
    let warps = 4 * variant.tile().consumers;
    let mut timer = CycleTimer::new(ctx, &plan, 1)?;
    let ctas = timer.ctas();
    let stream = ctx.stream();
    let mut bufs = Vec::with_capacity(sets.max(1));
    for s in 0..sets.max(1) as u64 {
        let q = stream.clone_htod(&random_bits(params.dtype, params.q_len(), 3 * s))?;
        let k = stream.clone_htod(&random_bits(params.dtype, params.kv_len(), 3 * s + 1))?;
        let v = stream.clone_htod(&random_bits(params.dtype, params.kv_len(), 3 * s + 2))?;
        let o = stream.alloc_zeros::<u16>(params.q_len())?;
        bufs.push((q, k, v, o));
    }
    let mut records = Vec::with_capacity(launches);
    let warmup = bufs.len();
    for i in 0..warmup + launches {
        use cudarc::driver::DevicePtr;
        let (q, k, v, o) = &bufs[i % bufs.len()];
        timer.clear(ctx, 1)?;
        timer.select(ctx, 0)?;
        let (qp, kp, vp, op) = (
            q.device_ptr(stream).0,
            k.device_ptr(stream).0,
            v.device_ptr(stream).0,
            o.device_ptr(stream).0,
        );
        // SAFETY: the buffers hold the plan's q/k/v/o lengths of its dtype (16-bit elements),
        // allocated on this context and alive until the synchronising read below.
        unsafe { plan.launch_raw(qp, kp, vp, op, 0)? };
        timer.read(ctx, 1)?;
        if i >= warmup {
            records.push(timer.words()[..ctas * WORDS].to_vec());
        }
    }
    reduce(variant.name(), &records, ctas, warps)
}

/// The report as a table (cycles; ns at the measured clock).
pub fn render(r: &PhaseReport) -> String {
    let ns = |c: f64| c / r.mhz * 1000.0;
    let mut s = format!(
        "phases of {} ({} CTAs, {} launches, SM clock {:.0} MHz; median CTA per launch, median over launches)\n",
        r.variant, r.ctas, r.launches, r.mhz
    );
    let tiles = r.tiles.median.max(1.0);
    s += &format!(
        "{:44} {:>9} {:>9} {:>12}\n",
        "phase (summed over the CTA's tiles)", "cycles", "ns", "cycles/tile"
    );
    for (name, p) in PHASES.iter().zip(&r.phases) {
        s += &format!(
            "{name:44} {:>9.0} {:>9.0} {:>12.0}\n",
            p.median,
            ns(p.median),
            p.median / tiles
        );
    }
    s += &format!("{:44} {:>9.1}\n", "tiles per CTA (median CTA)", tiles);
    s += &format!(
        "{:44} {:>9.0} {:>9.0}\n{:44} {:>9.0} {:>9.0}\n",
        "CTA total (median CTA)",
        r.total_median_cta.median,
        ns(r.total_median_cta.median),
        "CTA total (slowest CTA)",
        r.total_max_cta.median,
        ns(r.total_max_cta.median)
    );
    s += &format!(
        "{:44} {:>9} {:>9.0}\n{:44} {:>9} {:>9.0}\n",
        "first CTA start → last CTA end",
        "",
        r.span_ns.median,
        "spread of CTA starts",
        "",
        r.start_skew_ns.median
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(marks: [u64; 6], start_ns: u64, end_ns: u64, warps: usize) -> Vec<u64> {
        let mut r = vec![0u64; WORDS];
        r[START_CLOCK] = marks[0];
        r[START_NS] = start_ns;
        r[PHASE_INIT] = marks[1];
        r[PHASE_Q] = marks[2];
        r[PHASE_S0] = marks[3];
        r[PHASE_LOOP] = marks[4];
        r[PHASE_TILES] = 2;
        for w in 0..warps {
            r[STOP_CLOCK + w] = marks[5] - w as u64;
            r[STOP_NS + w] = end_ns - w as u64;
        }
        r
    }

    #[test]
    fn phases_are_differences_of_consecutive_marks() {
        let r = record([100, 150, 1150, 1400, 3400, 3900], 10, 2000, 4);
        let p = cta_phases(&r, 4).unwrap();
        assert_eq!(p.cycles, [50, 1000, 250, 2000, 500]);
        assert_eq!(p.tiles, 2);
        let mut one = r.clone();
        one[PHASE_TILES] = 0; // a build without the count reads as one tile
        assert_eq!(cta_phases(&one, 4).unwrap().tiles, 1);
        assert_eq!((p.start_ns, p.end_ns), (10, 2000));
    }

    #[test]
    fn missing_or_disordered_marks_are_rejected() {
        let mut r = record([100, 150, 1150, 1400, 3400, 3900], 10, 2000, 4);
        r[PHASE_Q] = 0;
        assert!(cta_phases(&r, 4).is_none());
        let mut r = record([100, 150, 1150, 1400, 3400, 3900], 10, 2000, 4);
        r[PHASE_S0] = 1000; // before the Q mark
        assert!(cta_phases(&r, 4).is_none());
    }

    #[test]
    fn reduce_takes_medians_spans_and_the_clock() {
        let warps = 4;
        let mut launch = record([1, 11, 111, 211, 1211, 2211], 1000, 2100, warps);
        launch.extend(record([1, 21, 121, 221, 1221, 2221], 1100, 2300, warps));
        launch.extend(record([1, 31, 131, 231, 1231, 2231], 1200, 2200, warps));
        let r = reduce("v".into(), &[launch], 3, warps).unwrap();
        assert_eq!(r.phases[0].median, 20.0);
        assert_eq!(r.phases[3].median, 1000.0);
        assert_eq!(r.tiles.median, 2.0);
        assert!(render(&r).contains("tiles per CTA"));
        assert_eq!(r.total_median_cta.median, 2220.0);
        assert_eq!(r.total_max_cta.median, 2230.0);
        assert_eq!(r.span_ns.median, 1300.0);
        assert_eq!(r.start_skew_ns.median, 200.0);
        assert!(r.mhz > 0.0);
        let empty = vec![0u64; 3 * WORDS];
        assert!(reduce("v".into(), &[empty], 3, warps).is_err());
    }
}
