//! The verdict a user acts on (issue 13), GPU-free: the attribution table row by row, the
//! whole pipeline (simulated quantised timings → analysis → attribution) for each outcome, the
//! cycle summary, and the tables that show it.

use flashcore::leakage::cycles::LaunchCycles;
use flashcore::leakage::report::{format_cycles_table, format_floor_table, format_verdict_table};
use flashcore::leakage::run::{summarize, summarize_cycles};
use flashcore::leakage::stats::{Class, Measurement, CROPS, LEAK_T};
use flashcore::leakage::verdict::FLOOR_SLACK;
use flashcore::leakage::{attribute, Attribution, ClassResult, Evidence};
use rand::{Rng, SeedableRng};

fn ev(time: Option<f64>, cycles: Option<f64>, floor: Option<f64>) -> Evidence {
    Evidence {
        time_t: time,
        cycles_t: cycles,
        floor_t: floor,
    }
}

#[test]
fn attribution_table() {
    use Attribution::*;
    // Cycles decide first, whatever the time says.
    assert_eq!(attribute(ev(Some(1.0), Some(4.6), Some(9.0))), CycleLeak);
    assert_eq!(attribute(ev(None, Some(50.0), None)), CycleLeak);
    // Time within the threshold passes, measured or not.
    assert_eq!(attribute(ev(Some(4.5), Some(1.0), Some(2.0))), NoLeak);
    assert_eq!(attribute(ev(Some(3.0), None, None)), NoLeak);
    // Time leak, cycles clean: against the floor.
    assert_eq!(attribute(ev(Some(9.0), Some(2.0), Some(8.0))), WithinFloor);
    assert_eq!(
        attribute(ev(Some(8.0 + FLOOR_SLACK), Some(2.0), Some(8.0))),
        WithinFloor
    );
    assert_eq!(
        attribute(ev(Some(8.01 + FLOOR_SLACK), Some(2.0), Some(8.0))),
        AboveFloor
    );
    // A clean floor: a time leak is above it.
    assert_eq!(attribute(ev(Some(6.0), Some(2.0), Some(1.0))), AboveFloor);
    // Missing evidence cannot clear a time leak.
    assert_eq!(attribute(ev(Some(9.0), None, Some(9.0))), Unattributed);
    assert_eq!(attribute(ev(Some(9.0), Some(1.0), None)), Unattributed);
    assert_eq!(attribute(ev(None, Some(1.0), Some(1.0))), Inconclusive);
    // Which pass.
    assert!(NoLeak.passes() && WithinFloor.passes());
    for a in [CycleLeak, AboveFloor, Unattributed, Inconclusive] {
        assert!(!a.passes(), "{a:?}");
        assert!(!a.explain().is_empty());
    }
    assert!(CycleLeak.name().starts_with("FAIL") && WithinFloor.name().starts_with("pass"));
}

fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(1e-300);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// `n` event timings like the device's: ~11.45 µs, 20 ns of noise, a 2% tail, quantised to the
/// 32 ns timer step, the fixed class shifted by `shift` µs.
fn timings(n: usize, seed: u64, shift: f64) -> Vec<Measurement> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let class = if rng.random::<bool>() {
                Class::Fixed
            } else {
                Class::Random
            };
            let mut x = 11.45 + 0.02 * normal(&mut rng);
            if class == Class::Fixed {
                x += shift;
            }
            if rng.random::<f64>() < 0.02 {
                x += 0.5 * rng.random::<f64>();
            }
            Measurement {
                class,
                time_us: (x / 0.032).round() * 0.032,
            }
        })
        .collect()
}

/// Cycle records: ~22 000 cycles per CTA with noise, the fixed class shifted by `shift` cycles;
/// 1.98 GHz, the fixed class's clock `mhz_shift` lower.
fn cycle_records(
    n: usize,
    seed: u64,
    shift: f64,
    mhz_shift: f64,
) -> Vec<(Measurement, LaunchCycles)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let class = if rng.random::<bool>() {
                Class::Fixed
            } else {
                Class::Random
            };
            let fixed = class == Class::Fixed;
            let cycles = 22_000.0 + 40.0 * normal(&mut rng) + if fixed { shift } else { 0.0 };
            let mhz = 1980.0 + 2.0 * normal(&mut rng) - if fixed { mhz_shift } else { 0.0 };
            let time_us = 11.45 + 0.02 * normal(&mut rng);
            (
                Measurement { class, time_us },
                LaunchCycles {
                    cycles,
                    max_cycles: cycles as u64 + 100,
                    span_ns: (cycles / mhz * 1000.0) as u64,
                    mhz: Some(mhz),
                },
            )
        })
        .collect()
}

const N: usize = 50_000;

/// The kernel's result with its cycles and floor attached, attributed as the harness does.
fn class_result(time_shift: f64, floor_shift: f64, cycle_shift: f64, seed: u64) -> ClassResult {
    let mut r = summarize("zeros", &timings(N, seed, time_shift), false, 1.0, CROPS);
    r.floor = Some(Box::new(summarize(
        "zeros",
        &timings(N, seed + 1, floor_shift),
        false,
        1.0,
        CROPS,
    )));
    r.cycles = Some(summarize_cycles(
        &cycle_records(N, seed + 2, cycle_shift, 0.5),
        false,
        CROPS,
    ));
    r.attribution = attribute(r.evidence());
    r
}

#[test]
fn simulated_outcomes_are_attributed() {
    // Shift of 1.3 ns at 50 000 timings: max |t| ≈ 7 (well above 4.5, like the H100 residual).
    let shift = 0.0013;
    let hw = class_result(shift, shift, 0.0, 10);
    let e = hw.evidence();
    assert!(e.time_t.unwrap() > LEAK_T, "{e:?}");
    assert!(e.floor_t.unwrap() > LEAK_T, "{e:?}");
    assert!(e.cycles_t.unwrap() < LEAK_T, "{e:?}");
    assert_eq!(hw.attribution, Attribution::WithinFloor, "{e:?}");

    // The same with another seed: the floor test is robust to the draw.
    let hw2 = class_result(shift, shift, 0.0, 20);
    assert_eq!(
        hw2.attribution,
        Attribution::WithinFloor,
        "{:?}",
        hw2.evidence()
    );

    // The kernel's time difference twice the floor's: above it.
    let above = class_result(2.0 * shift, shift, 0.0, 30);
    assert_eq!(
        above.attribution,
        Attribution::AboveFloor,
        "{:?}",
        above.evidence()
    );

    // A shift of 20 cycles per CTA (0.1%) is a cycle leak, whatever the time says.
    let cyc = class_result(0.0, shift, 20.0, 40);
    assert!(cyc.evidence().cycles_t.unwrap() > 10.0);
    assert_eq!(cyc.attribution, Attribution::CycleLeak);

    // Nothing anywhere.
    let clean = class_result(0.0, 0.0, 0.0, 50);
    assert_eq!(
        clean.attribution,
        Attribution::NoLeak,
        "{:?}",
        clean.evidence()
    );

    // The clock moved (0.5 MHz lower for the fixed class) and the cycles did not: the MHz test
    // sees it, the cycle test does not.
    let c = clean.cycles.as_ref().unwrap();
    assert!(c.mhz.max_abs_t().unwrap() > 10.0, "{:?}", c.mhz);
    assert!(c.fixed_mhz.unwrap().mean < c.random_mhz.unwrap().mean);

    // The tables show every number the verdict used.
    let results = [hw, above, cyc, clean];
    for r in &results {
        eprintln!("{:?} -> {:?}", r.evidence(), r.attribution);
    }
    let v = format_verdict_table(&results);
    assert!(v.contains("pass: time only, within floor"), "{v}");
    assert!(v.contains("FAIL: above floor"), "{v}");
    assert!(v.contains("FAIL: leak in cycles"), "{v}");
    assert!(v.contains("pass: no leak"), "{v}");
    assert_eq!(v.lines().count(), 2 + results.len(), "{v}");
    let ct = format_cycles_table(&results);
    assert!(ct.contains("cycles |t|") && ct.contains("MHz |t|"), "{ct}");
    assert!(ct.contains("22000") || ct.contains("2200"), "{ct}");
    assert_eq!(ct.lines().count(), 2 + results.len(), "{ct}");
    let ft = format_floor_table(&results);
    assert_eq!(ft.lines().count(), 2 + results.len(), "{ft}");
    // JSON keeps it all.
    let j = serde_json::to_value(&results[0]).unwrap();
    assert_eq!(j["attribution"], "within_floor");
    assert!(j["floor"]["max_abs_t"].as_f64().unwrap() > LEAK_T);
    assert!(j["cycles"]["cycles"]["raw"].is_object());
}

#[test]
fn cycle_summary_counts_and_skips_launches_without_a_clock() {
    let mut m = cycle_records(1000, 1, 0.0, 0.0);
    m[0].1.mhz = None;
    let c = summarize_cycles(&m, true, CROPS);
    assert_eq!(c.measurements, 1000);
    assert!(c.stopped_by_budget);
    let n_mhz = c.fixed_mhz.unwrap().n + c.random_mhz.unwrap().n;
    assert_eq!(n_mhz, 999, "a launch whose timer did not tick has no clock");
    assert_eq!(c.fixed_cycles.unwrap().n + c.random_cycles.unwrap().n, 1000);
    let med = c.fixed_cycles.unwrap().median;
    assert!((21_800.0..22_200.0).contains(&med), "{med}");
}
