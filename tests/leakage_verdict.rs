//! The verdict a user acts on, GPU-free: the attribution table row by row, the
//! whole pipeline (simulated quantised timings → analysis → attribution) for each outcome, the
//! cycle summary, and the tables that show it.

use flashcore::leakage::cycles::LaunchCycles;
use flashcore::leakage::report::{
    format_cycles_table, format_floor_cycles_table, format_floor_table, format_verdict_table,
    summary_line, EnvInfo, LeakageFile, RunInfo, SCHEMA_VERSION,
};
use flashcore::leakage::run::{summarize, summarize_cycles};
use flashcore::leakage::stats::{Class, Measurement, CROPS, LEAK_T};
use flashcore::leakage::verdict::{cycles_within_floor, FLOOR_SLACK};
use flashcore::leakage::{attribute, Attribution, ClassResult, Evidence};
use rand::{Rng, SeedableRng};

fn ev(time: Option<f64>, cycles: Option<f64>, floor: Option<f64>) -> Evidence {
    Evidence {
        time_t: time,
        cycles_t: cycles,
        floor_t: floor,
        ..Evidence::default()
    }
}

/// Evidence with the floor's cycles too (raw shifts unknown).
fn ev4(time: f64, cycles: f64, floor: f64, floor_cycles: Option<f64>) -> Evidence {
    Evidence {
        time_t: Some(time),
        cycles_t: Some(cycles),
        floor_t: Some(floor),
        floor_cycles_t: floor_cycles,
        ..Evidence::default()
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
    assert!(NoLeak.passes() && WithinFloor.passes() && CyclesWithinFloor.passes());
    for a in [CycleLeak, AboveFloor, Unattributed, Inconclusive] {
        assert!(!a.passes(), "{a:?}");
        assert!(!a.explain().is_empty());
    }
    assert!(CycleLeak.name().starts_with("FAIL") && WithinFloor.name().starts_with("pass"));
    assert!(
        CyclesWithinFloor.name().starts_with("pass") && !CyclesWithinFloor.explain().is_empty()
    );
}

/// The timing test's cycle rule: a cycles |t| above 4.5 passes only within the floor's cycles.
#[test]
fn cycles_against_the_floors_cycles() {
    use Attribution::*;
    // The recorded H100 run's zeros class (cycles 4.96), against floor cycles of each kind.
    assert_eq!(
        attribute(ev4(2.96, 4.96, 1.83, Some(5.2))),
        CyclesWithinFloor
    );
    assert_eq!(
        attribute(ev4(2.96, 4.96, 1.83, Some(2.0))),
        CyclesWithinFloor
    );
    assert_eq!(attribute(ev4(2.96, 4.96, 1.83, Some(1.9))), CycleLeak);
    // No floor cycles (--no-floor, a control, secret-length mode): no clearing.
    assert_eq!(attribute(ev4(2.96, 4.96, 1.83, None)), CycleLeak);
    assert_eq!(attribute(ev(Some(2.0), Some(12.28), None)), CycleLeak);
    // The slack is inclusive, and no wider.
    assert_eq!(
        attribute(ev4(1.0, 8.0 + FLOOR_SLACK, 1.0, Some(8.0))),
        CyclesWithinFloor
    );
    assert_eq!(
        attribute(ev4(1.0, 8.01 + FLOOR_SLACK, 1.0, Some(8.0))),
        CycleLeak
    );
    // A kernel effect far above the floor's: the skip-past-length control's size.
    assert_eq!(attribute(ev4(660.0, 1152.0, 2.0, Some(5.0))), CycleLeak);
    // Non-finite numbers never clear.
    assert_eq!(
        attribute(ev4(1.0, f64::INFINITY, 1.0, Some(f64::INFINITY))),
        CycleLeak
    );
    assert_eq!(
        attribute(ev4(1.0, 6.0, 1.0, Some(f64::INFINITY))),
        CycleLeak
    );
    // Cycles within the floor's, time: each case of the time rule still applies.
    assert_eq!(attribute(ev4(9.0, 6.0, 8.0, Some(6.0))), CyclesWithinFloor);
    assert_eq!(attribute(ev4(9.0, 6.0, 2.0, Some(6.0))), AboveFloor);
    let no_floor_time = Evidence {
        floor_t: None,
        ..ev4(9.0, 6.0, 0.0, Some(6.0))
    };
    assert_eq!(attribute(no_floor_time), Unattributed);
    let no_time = Evidence {
        time_t: None,
        ..ev4(0.0, 6.0, 1.0, Some(6.0))
    };
    assert_eq!(attribute(no_time), Inconclusive);
    // Cycles ≤ 4.5: the floor's cycles change nothing.
    assert_eq!(attribute(ev4(2.0, 4.5, 1.0, Some(9.0))), NoLeak);
    assert_eq!(attribute(ev4(9.0, 3.0, 8.0, Some(9.0))), WithinFloor);
    // Opposite significant shifts are different effects: no clearing, whatever the sizes.
    let opposite = Evidence {
        cycles_raw_t: Some(-5.5),
        floor_cycles_raw_t: Some(7.0),
        ..ev4(2.0, 5.5, 1.0, Some(7.0))
    };
    assert!(!cycles_within_floor(&opposite));
    assert_eq!(attribute(opposite), CycleLeak);
    let same = Evidence {
        cycles_raw_t: Some(-5.5),
        floor_cycles_raw_t: Some(-7.0),
        ..opposite
    };
    assert_eq!(attribute(same), CyclesWithinFloor);
    // An insignificant raw shift says nothing about direction.
    let weak = Evidence {
        cycles_raw_t: Some(-1.0),
        floor_cycles_raw_t: Some(7.0),
        ..opposite
    };
    assert_eq!(attribute(weak), CyclesWithinFloor);
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
    class_result4(time_shift, floor_shift, cycle_shift, None, seed)
}

/// The same with the floor's cycle-timer build, its cycles shifted by `floor_cycle_shift`.
fn class_result4(
    time_shift: f64,
    floor_shift: f64,
    cycle_shift: f64,
    floor_cycle_shift: Option<f64>,
    seed: u64,
) -> ClassResult {
    let mut r = summarize("zeros", &timings(N, seed, time_shift), false, 1.0, CROPS);
    let mut floor = summarize(
        "zeros",
        &timings(N, seed + 1, floor_shift),
        false,
        1.0,
        CROPS,
    );
    floor.cycles = floor_cycle_shift
        .map(|s| summarize_cycles(&cycle_records(N, seed + 3, s, 0.5), false, CROPS));
    floor.attribution = attribute(floor.evidence());
    r.floor = Some(Box::new(floor));
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

/// The whole pipeline for the cycle rule: the same cycle shift in the kernel and its floor
/// passes; twice the floor's, or one the floor does not show, fails.
#[test]
fn simulated_cycle_outcomes_are_attributed() {
    // 2.5 cycles per CTA in 40 of noise at 50 000 launches: max |t| ≈ 7.
    let shift = 2.5;
    for seed in [100, 110] {
        let hw = class_result4(0.0, 0.0, shift, Some(shift), seed);
        let e = hw.evidence();
        assert!(e.cycles_t.unwrap() > LEAK_T, "{e:?}");
        assert!(e.floor_cycles_t.unwrap() > LEAK_T, "{e:?}");
        assert!(e.cycles_raw_t.unwrap() > 0.0 && e.floor_cycles_raw_t.unwrap() > 0.0);
        assert_eq!(hw.attribution, Attribution::CyclesWithinFloor, "{e:?}");
        // The floor's own verdict (no floor under it) is a cycle difference.
        assert_eq!(
            hw.floor.as_ref().unwrap().attribution,
            Attribution::CycleLeak
        );
    }
    // Twice the floor's shift: above it.
    let above = class_result4(0.0, 0.0, 2.0 * shift, Some(shift), 120);
    let e = above.evidence();
    assert!(
        e.cycles_t.unwrap() > e.floor_cycles_t.unwrap() + FLOOR_SLACK,
        "{e:?}"
    );
    assert_eq!(above.attribution, Attribution::CycleLeak, "{e:?}");
    // The floor shows nothing: the kernel's shift is its own.
    let own = class_result4(0.0, 0.0, shift, Some(0.0), 130);
    assert_eq!(
        own.attribution,
        Attribution::CycleLeak,
        "{:?}",
        own.evidence()
    );
    // Opposite shifts of the same size: different effects.
    let opposite = class_result4(0.0, 0.0, shift, Some(-shift), 140);
    let e = opposite.evidence();
    assert!(
        e.cycles_t.unwrap() <= e.floor_cycles_t.unwrap() + FLOOR_SLACK,
        "{e:?}"
    );
    assert_eq!(opposite.attribution, Attribution::CycleLeak, "{e:?}");
    // Cycles within the floor's, time above the floor's time: above floor.
    let time_above = class_result4(0.0026, 0.0, shift, Some(shift), 150);
    assert_eq!(
        time_above.attribution,
        Attribution::AboveFloor,
        "{:?}",
        time_above.evidence()
    );

    // The tables and the summary lines show every number the verdict used.
    let results = [hw_result(), above, own, time_above];
    let v = format_verdict_table(&results);
    for col in [
        "floor cycles |t|",
        "MHz |t|",
        "floor MHz |t|",
        "pass: cycles within floor",
        "FAIL: leak in cycles",
    ] {
        assert!(v.contains(col), "{col}: {v}");
    }
    assert_eq!(v.lines().count(), 2 + results.len(), "{v}");
    let fc = format_floor_cycles_table(&results);
    assert_eq!(fc.lines().count(), 2 + results.len(), "{fc}");
    assert!(fc.contains("MHz |t|"), "{fc}");
    let pass = summary_line(&results, Attribution::CyclesWithinFloor).unwrap();
    assert!(
        pass.starts_with("pass: cycles within floor: zeros (cycles |t| "),
        "{pass}"
    );
    assert!(pass.contains(" vs floor "), "{pass}");
    let fail = summary_line(&results, Attribution::CycleLeak).unwrap();
    assert!(
        fail.starts_with("FAIL: leak in cycles: zeros (cycles |t| "),
        "{fail}"
    );
    assert!(summary_line(&results, Attribution::Unattributed).is_none());
    // Without floor cycles the line says so.
    let lone = class_result(0.0, 0.0, 20.0, 160);
    let line = summary_line(std::slice::from_ref(&lone), Attribution::CycleLeak).unwrap();
    assert!(line.contains("no floor cycles"), "{line}");
}

fn hw_result() -> ClassResult {
    class_result4(0.0, 0.0, 2.5, Some(2.5), 100)
}

/// Schema 3 round trip: the floor's cycles, the new attribution and the run's flags survive a
/// write and a read, and a version-2 file (no floor cycles) still reads.
#[test]
fn json_round_trip_keeps_the_floor_cycles() {
    let results = vec![hw_result(), class_result(0.0, 0.0, 20.0, 160)];
    let run = RunInfo {
        batch: 1,
        heads: 8,
        seqlen: 512,
        head_dim: 64,
        dtype: "f16".into(),
        layout: "bshd".into(),
        causal: false,
        secret_len: false,
        kernel: "shipped".into(),
        measurements_requested: N,
        budget_s: Some(20.0),
        pool: 16,
        seed: 1,
        queue_us: 20.0,
        cycles: true,
        floor: true,
        floor_cycles: true,
        decode: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leak.json");
    LeakageFile::new(run, EnvInfo::default(), results.clone())
        .write(&path)
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["version"], SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION, 4);
    assert_eq!(v["floor_slack"], FLOOR_SLACK);
    assert_eq!(v["run"]["floor_cycles"], true);
    let r0 = &v["results"][0];
    assert_eq!(r0["attribution"], "cycles_within_floor");
    assert!(r0["floor"]["cycles"]["cycles"]["raw"]["t"].is_number());
    assert!(r0["floor"]["cycles"]["mhz"]["raw"].is_object());
    assert!(r0["floor"]["cycles"]["fixed_cycles"]["median"].is_number());
    assert_eq!(r0["floor"]["attribution"], "cycle_leak");
    assert_eq!(v["results"][1]["attribution"], "cycle_leak");
    assert!(v["results"][1]["floor"].get("cycles").is_none());
    let back: LeakageFile = serde_json::from_str(&text).unwrap();
    assert_eq!(back.results.len(), 2);
    let close = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * y.abs().max(1.0),
        (x, y) => x == y,
    };
    for (a, b) in back.results.iter().zip(&results) {
        let (ea, eb) = (a.evidence(), b.evidence());
        for (x, y) in [
            (ea.time_t, eb.time_t),
            (ea.cycles_t, eb.cycles_t),
            (ea.floor_t, eb.floor_t),
            (ea.floor_cycles_t, eb.floor_cycles_t),
            (ea.cycles_raw_t, eb.cycles_raw_t),
            (ea.floor_cycles_raw_t, eb.floor_cycles_raw_t),
        ] {
            assert!(close(x, y), "{ea:?} vs {eb:?}");
        }
        assert_eq!(a.attribution, b.attribution);
        assert_eq!(
            attribute(a.evidence()),
            a.attribution,
            "re-derivable from the file"
        );
    }
    // A version-2 file: no floor_cycles flag, no floor cycles.
    let mut old = v.clone();
    old["version"] = 2.into();
    old["run"].as_object_mut().unwrap().remove("floor_cycles");
    old["results"][0]["floor"]
        .as_object_mut()
        .unwrap()
        .remove("cycles");
    let back: LeakageFile = serde_json::from_value(old).unwrap();
    assert!(!back.run.floor_cycles);
    assert_eq!(back.results[0].evidence().floor_cycles_t, None);
}

/// Which runs get a floor: the shipped kernel in value mode only. A control's floor would carry
/// the control's leak, and in secret-length mode the floor build masks by the secret length as
/// the shipped kernel does: a floor that carries the secret could clear it.
#[test]
fn no_floor_for_controls_or_secret_length() {
    use clap::Parser;
    use flashcore::cli::leakage::{config, LeakageArgs};
    use flashcore::kernels::LeakyControl;
    use flashcore::leakage::LeakageConfig;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: LeakageArgs,
    }
    let cfg_of = |args: &[&str]| {
        let cli = Cli::try_parse_from(std::iter::once("leakage").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        config(&cli.a).unwrap_or_else(|e| panic!("{args:?}: {e}")).0
    };
    let shipped = cfg_of(&[]);
    assert!(
        shipped.floor && shipped.cycles,
        "value mode: floor and its cycles"
    );
    let secret = cfg_of(&["--secret-len"]);
    assert!(!secret.floor && secret.cycles);
    let skip = cfg_of(&["--control", "skip-past-length"]);
    assert!(!skip.floor && skip.cycles && skip.secret_len);
    let early = cfg_of(&["--control", "early-exit"]);
    assert!(!early.floor && !early.cycles);
    let floor = cfg_of(&["--control", "floor"]);
    assert!(floor.floor_kernel && !floor.floor && floor.cycles);
    let none = cfg_of(&["--no-floor"]);
    assert!(!none.floor && none.cycles);

    // The library refuses the combinations outright.
    let mut c = LeakageConfig::new(flashcore::attention::AttentionParams::new(1, 8, 512, 64));
    assert!(c.floor && c.validate().is_ok());
    c.secret_len = true;
    let e = c.validate().unwrap_err();
    assert!(
        e.contains("secret-length") && e.contains("--no-floor"),
        "{e}"
    );
    c.control = Some(LeakyControl::SkipPastSecretLength);
    assert!(c.validate().is_err());
    c.floor = false;
    assert!(c.validate().is_ok());
}
