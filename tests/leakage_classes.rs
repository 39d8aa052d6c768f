//! The fixed input classes are what they say, for both dtypes; class names parse per mode; the
//! result table and JSON file hold what a run measured.

use flashcore::attention::DType;
use flashcore::leakage::classes::{max_finite_bits, one_bits};
use flashcore::leakage::report::{format_table, EnvInfo, LeakageFile, RunInfo};
use flashcore::leakage::run::summarize;
use flashcore::leakage::{Class, FixedClass, LengthClass, Measurement, ValueClass, Verdict};

const D: usize = 64;
const LEN: usize = 4 * D * 3;

fn value(dtype: DType, bits: u16) -> f64 {
    match dtype {
        DType::F16 => half::f16::from_bits(bits).to_f64(),
        DType::Bf16 => half::bf16::from_bits(bits).to_f64(),
    }
}

#[test]
fn format_constants() {
    assert_eq!(max_finite_bits(DType::F16), half::f16::MAX.to_bits());
    assert_eq!(max_finite_bits(DType::Bf16), half::bf16::MAX.to_bits());
    assert_eq!(one_bits(DType::F16), half::f16::ONE.to_bits());
    assert_eq!(one_bits(DType::Bf16), half::bf16::ONE.to_bits());
}

#[test]
fn every_class_has_its_pattern() {
    for dtype in [DType::F16, DType::Bf16] {
        let max = value(dtype, max_finite_bits(dtype));
        let tiny = value(dtype, 1);
        assert!(tiny > 0.0 && !value(dtype, 1).is_nan());
        for c in ValueClass::ALL {
            let bits = c.fill(dtype, D, LEN);
            assert_eq!(bits.len(), LEN);
            let x: Vec<f64> = bits.iter().map(|&b| value(dtype, b)).collect();
            assert!(
                x.iter().all(|v| v.is_finite()),
                "{c:?} {dtype:?}: finite only"
            );
            for row in x.chunks(D) {
                match c {
                    ValueClass::Zeros => {
                        assert!(bits.iter().all(|&b| b == 0), "+0.0, not −0.0")
                    }
                    ValueClass::MaxFinite => {
                        assert!(row.iter().all(|v| v.abs() == max));
                        assert_eq!(row.iter().filter(|v| **v > 0.0).count(), D / 2);
                    }
                    ValueClass::Denormal => {
                        assert!(row.iter().all(|v| v.abs() == tiny));
                        assert_eq!(row.iter().filter(|v| **v > 0.0).count(), D / 2);
                    }
                    ValueClass::OneHot => {
                        assert_eq!(row.iter().filter(|v| **v == 1.0).count(), 1);
                        assert_eq!(row.iter().filter(|v| **v == 0.0).count(), D - 1);
                    }
                    ValueClass::AllEqual => assert!(row.iter().all(|v| *v == 1.0)),
                    ValueClass::Range => {
                        for want in [max, -max, tiny, -tiny] {
                            assert_eq!(row.iter().filter(|v| **v == want).count(), D / 4);
                        }
                    }
                    ValueClass::OneRandom => unreachable!("not in the default sweep"),
                }
            }
        }
        // Subnormal really is the smallest positive value of the format.
        let expect = match dtype {
            DType::F16 => 2f64.powi(-24),
            DType::Bf16 => 2f64.powi(-133),
        };
        assert_eq!(tiny, expect);
    }
    // The harness check: a fixed draw, uniform in [−1, 1), the same every time, not sorted.
    let r = ValueClass::OneRandom.fill(DType::F16, D, 4096);
    assert_eq!(r, ValueClass::OneRandom.fill(DType::F16, D, 4096));
    let x: Vec<f64> = r.iter().map(|&b| value(DType::F16, b)).collect();
    assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    assert!(mean.abs() < 0.05, "{mean}");
    assert!(x.iter().filter(|v| **v < 0.0).count() > 1800);
    assert_eq!(
        FixedClass::parse("one-random", false),
        Ok(FixedClass::Values(ValueClass::OneRandom))
    );
    // One-hot moves along the rows.
    let oh = ValueClass::OneHot.fill(DType::F16, D, 3 * D);
    let pos: Vec<usize> = oh
        .chunks(D)
        .map(|r| r.iter().position(|&b| b != 0).unwrap())
        .collect();
    assert_eq!(pos, vec![0, 1, 2]);
}

#[test]
fn class_names_parse_per_mode() {
    assert_eq!(FixedClass::all(false).len(), 6);
    assert_eq!(FixedClass::all(true).len(), 4);
    for c in FixedClass::all(false) {
        assert_eq!(FixedClass::parse(c.name(), false), Ok(c));
        assert!(FixedClass::parse(c.name(), true).is_err());
    }
    for c in FixedClass::all(true) {
        assert_eq!(FixedClass::parse(c.name(), true), Ok(c));
        let e = FixedClass::parse(c.name(), false).unwrap_err();
        assert!(e.contains("--secret-len"), "{e}");
    }
    let e = FixedClass::parse("nope", false).unwrap_err();
    assert!(e.contains("zeros") && e.contains("range"), "{e}");
    assert_eq!(LengthClass::Zero.length(512), 0);
    assert_eq!(LengthClass::One.length(512), 1);
    assert_eq!(LengthClass::Half.length(512), 256);
    assert_eq!(LengthClass::Full.length(512), 512);
}

fn measurements(shift: f64) -> Vec<Measurement> {
    (0..2000)
        .map(|i| {
            let class = if i % 3 == 0 {
                Class::Fixed
            } else {
                Class::Random
            };
            let jitter = ((i * 7919) % 13) as f64 * 0.01;
            let s = if class == Class::Fixed { shift } else { 0.0 };
            Measurement {
                class,
                time_us: 9.0 + jitter + s,
            }
        })
        .collect()
}

#[test]
fn table_and_json() {
    let quiet = summarize("zeros", &measurements(0.0), false, 1.5, 100);
    let loud = summarize("onehot", &measurements(1.0), true, 2.0, 100);
    assert_eq!(quiet.verdict, Verdict::NoLeak);
    assert_eq!(loud.verdict, Verdict::CertainLeak);
    assert_eq!(quiet.measurements, 2000);
    assert_eq!(quiet.fixed_us.unwrap().n + quiet.random_us.unwrap().n, 2000);
    let table = format_table(&[quiet.clone(), loud.clone()]);
    assert!(
        table.contains("max |t|") && table.contains("verdict"),
        "{table}"
    );
    assert!(
        table.contains("no leak") && table.contains("CERTAIN LEAK"),
        "{table}"
    );
    assert!(table.contains("2000 (budget)"), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");

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
        measurements_requested: 2000,
        budget_s: None,
        pool: 16,
        seed: 1,
        queue_us: 20.0,
        cycles: false,
        floor: false,
        floor_cycles: false,
        decode: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leak.json");
    LeakageFile::new(run, EnvInfo::default(), vec![quiet, loud])
        .write(&path)
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("valid JSON");
    assert_eq!(v["schema"], "flashcore-leakage");
    assert_eq!(v["leak_threshold"], 4.5);
    assert_eq!(v["version"], 4);
    assert!(
        v["run"].get("decode").is_none(),
        "no decode key outside decode mode"
    );
    assert_eq!(v["run"]["queue_us"], 20.0);
    assert_eq!(v["results"][0]["attribution"], "no_leak");
    assert_eq!(v["results"][1]["attribution"], "unattributed");
    assert!(
        v["results"][0].get("cycles").is_none(),
        "absent when not measured"
    );
    assert_eq!(v["results"][0]["verdict"], "no_leak");
    assert_eq!(v["results"][1]["verdict"], "certain_leak");
    assert_eq!(v["results"][1]["stopped_by_budget"], true);
    assert!(v["results"][1]["max_abs_t"].as_f64().unwrap() > 10.0);
    let back: LeakageFile = serde_json::from_value(v).unwrap();
    assert_eq!(back.results.len(), 2);
}
