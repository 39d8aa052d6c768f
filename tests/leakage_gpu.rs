//! The leakage test on a real GPU, with its power control: the shipped kernel passes, the
//! deliberately leaky control kernels fail (a test that cannot fail proves nothing). Skips
//! visibly without a GPU; fails instead when FLASHCORE_REQUIRE_GPU=1.
//!
//! The bound here is |t| < 10 for the shipped kernel (robust at 20 000 measurements) in SM cycles
//! (or within the hardware floor's cycles), and in time unless the SM clock itself moved with the
//! data (the DVFS residual: docs/security.md, seen on the H200); the CLI's verdict threshold
//! stays 4.5.
//!
//! The timing test's instruments too: the cycle timer reads plausible clocks and catches the
//! skip-past-length control in cycles (its power check), the floor control runs with its own
//! cycle count, and queued timing keeps the one-random self-check quiet.
//!
//! Decode mode: the KV-cache call with secret counts passes, contiguous and paged;
//! the same call with public counts (the walk ends at each count) is caught.

mod common;
use common::gpu;
use flashcore::attention::{AttentionParams, Context};
use flashcore::kernels::LeakyControl;
use flashcore::leakage::report::{format_table, format_verdict_table};
use flashcore::leakage::verdict::cycles_within_floor;
use flashcore::leakage::{
    Attribution, ClassResult, CycleResult, DecodeConfig, FixedClass, Harness, LeakageConfig,
    LengthClass, ValueClass,
};
use std::sync::Mutex;

/// One GPU test at a time: tests of one binary run on parallel threads, and a second kernel
/// stream on the device would only add noise.
static GPU: Mutex<()> = Mutex::new(());

const MEASUREMENTS: usize = 20_000;

fn measure(
    ctx: &Context,
    secret_len: bool,
    control: Option<LeakyControl>,
    class: FixedClass,
) -> ClassResult {
    measure_with(ctx, secret_len, control, class, |_| {})
}

fn measure_with(
    ctx: &Context,
    secret_len: bool,
    control: Option<LeakyControl>,
    class: FixedClass,
    adjust: impl FnOnce(&mut LeakageConfig),
) -> ClassResult {
    let mut cfg = LeakageConfig::new(AttentionParams::new(1, 8, 512, 64));
    cfg.secret_len = secret_len;
    cfg.control = control;
    // The floor comparison is for the shipped kernel in value mode; the early-exit control's
    // CTAs leave before their cycle record.
    cfg.floor = control.is_none() && !secret_len;
    cfg.cycles = control != Some(LeakyControl::EarlyExitOnZeroQ);
    adjust(&mut cfg);
    cfg.measurements = MEASUREMENTS;
    cfg.warmup = 500;
    let mut h = Harness::new(ctx, cfg).expect("harness");
    let r = h.run_class(class).expect("measurement");
    let kernel = control.map_or("shipped".to_string(), |c| format!("{c:?}"));
    eprintln!("{kernel}:\n{}", format_table(std::slice::from_ref(&r)));
    assert_eq!(r.measurements, MEASUREMENTS);
    assert!(!r.stopped_by_budget);
    let (f, rnd) = (r.fixed_us.unwrap(), r.random_us.unwrap());
    assert!(
        f.n > MEASUREMENTS / 3 && rnd.n > MEASUREMENTS / 3,
        "interleaving"
    );
    assert!(
        f.min > 0.0 && rnd.min > 0.0 && f.median < 10_000.0,
        "{f:?} {rnd:?}"
    );
    r
}

/// The fixed class's mean SM cycles per CTA relative to the random class's, (fixed − random) /
/// random, and its standard error (Welch).
fn relative_shift(c: &CycleResult) -> (f64, f64) {
    let (f, r) = (c.fixed_cycles.unwrap(), c.random_cycles.unwrap());
    let se = (f.stddev.powi(2) / f.n as f64 + r.stddev.powi(2) / r.n as f64).sqrt();
    ((f.mean - r.mean) / r.mean, se / r.mean)
}

fn max_t(r: &ClassResult) -> f64 {
    r.analysis.max_abs_t().expect("tests were made")
}

/// The cycle timer's numbers are those of a real H100/H200 run: every launch read back, clocks
/// between 0.5 and 2.5 GHz, a device-side span no longer than the event interval.
fn check_cycles(c: &CycleResult) {
    assert_eq!(c.measurements, MEASUREMENTS);
    let (f, r) = (c.fixed_cycles.unwrap(), c.random_cycles.unwrap());
    assert!(f.min > 0.0 && r.min > 0.0, "{f:?} {r:?}");
    for m in [c.fixed_mhz.unwrap(), c.random_mhz.unwrap()] {
        assert!((500.0..2500.0).contains(&m.median), "SM clock {m:?}");
    }
    let span = c.fixed_span_us.unwrap();
    assert!(span.median > 0.0 && span.median < 1000.0, "{span:?}");
}

#[test]
fn shipped_kernel_zeros_vs_random_shows_no_leak() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("shipped_kernel_zeros_vs_random_shows_no_leak") else {
        return;
    };
    let r = measure(&ctx, false, None, FixedClass::Values(ValueClass::Zeros));
    // The cycle timer and the floor ran on the same class.
    let c = r.cycles.as_ref().expect("cycle timer measured");
    check_cycles(c);
    let floor = r.floor.as_ref().expect("floor measured");
    assert_eq!(floor.measurements, MEASUREMENTS);
    // The floor's cycle-timer build ran on the same class and wrote every record.
    let fc = floor.cycles.as_ref().expect("floor cycles measured");
    check_cycles(fc);
    let e = r.evidence();
    assert!(
        e.floor_cycles_t.is_some() && e.cycles_raw_t.is_some(),
        "{e:?}"
    );
    // The instruction level: the SM cycles per CTA differ no more than the hardware floor's
    // (the same loads and GEMMs on the same inputs, no secret in the softmax) — by the verdict's
    // max-|t| rule, or, where the two builds' noise differs (the same shift gives a larger t in
    // the quieter one), by the shifts themselves: the kernel's relative cycle shift exceeds the
    // floor's, in the same direction, by less than 4.5 standard errors of the difference.
    let cycles_t = c.cycles.max_abs_t().unwrap();
    let (dk, sk) = relative_shift(c);
    let (df, sf) = relative_shift(fc);
    let excess = (dk.abs() - df.abs()) / (sk * sk + sf * sf).sqrt();
    let same_direction = dk.signum() == df.signum() || dk.abs() < 4.5 * sk;
    assert!(
        cycles_t < 10.0 || cycles_within_floor(&e) || (same_direction && excess < 4.5),
        "shipped kernel cycles: max |t| {cycles_t}, relative shift {dk:.2e} ± {sk:.1e} against \
         the floor's {df:.2e} ± {sf:.1e} ({e:?})"
    );
    // The time: |t| under 10, unless the SM clock itself followed the data (the DVFS residual of
    // docs/security.md: on the H200 zeros ran at a ~0.7% faster clock than random inputs, time
    // |t| 11–14 at this count). Then the first-order shift must be the clock's — the class with
    // the faster clock is the faster one — and the second-order test stays under 10.
    let time_t = max_t(&r);
    if time_t >= 10.0 {
        let mhz_t = c.mhz.raw.map_or(0.0, |x| x.t);
        let first = [r.analysis.raw, r.analysis.cropped]
            .into_iter()
            .flatten()
            .max_by(|a, b| a.t.abs().total_cmp(&b.t.abs()))
            .map_or(0.0, |x| x.t);
        let second = r.analysis.second_order.map_or(0.0, |x| x.t.abs());
        assert!(
            mhz_t.abs() >= 10.0 && first.signum() == -mhz_t.signum() && second < 10.0,
            "shipped kernel: time max |t| {time_t} not explained by the SM clock (MHz t {mhz_t}; \
             first-order t {first}, second-order |t| {second}; {:?})",
            r.analysis
        );
        eprintln!(
            "shipped kernel: time |t| {time_t:.2} with the SM clock following the data \
             (MHz t {mhz_t:.2}, first-order time t {first:.2}): the DVFS residual"
        );
    }
    eprintln!(
        "{}\nevidence {e:?} -> {}",
        format_verdict_table(std::slice::from_ref(&r)),
        r.attribution.name()
    );
    assert_ne!(r.attribution, Attribution::CycleLeak);
}

/// The floor with the cycle timer: launches, writes a record for every CTA of every
/// launch, with the shipped kernel's CTA count and cycles of the same order (same loads, same
/// GEMMs); here it is the kernel under test (`--control floor`) beside the shipped kernel's
/// cycle-timer build.
#[test]
fn floor_with_cycle_timer_produces_cycle_records() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("floor_with_cycle_timer_produces_cycle_records") else {
        return;
    };
    let class = FixedClass::Values(ValueClass::Denormal);
    let r = measure(&ctx, false, None, class);
    let shipped = r.cycles.as_ref().expect("shipped cycles");
    let floor = r
        .floor
        .as_ref()
        .and_then(|f| f.cycles.as_ref())
        .expect("floor cycles");
    check_cycles(floor);
    let (s, f) = (
        shipped.fixed_cycles.unwrap().median,
        floor.fixed_cycles.unwrap().median,
    );
    assert!(
        f > 0.5 * s && f < 2.0 * s,
        "floor {f} vs shipped {s} cycles per CTA"
    );
    // The floor's own verdict is judged without a floor under it.
    let fe = r.floor.as_ref().unwrap().evidence();
    assert!(fe.floor_t.is_none() && fe.floor_cycles_t.is_none());
}

#[test]
fn one_random_self_check_is_quiet_with_queued_timing() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("one_random_self_check_is_quiet_with_queued_timing") else {
        return;
    };
    let r = measure_with(
        &ctx,
        false,
        None,
        FixedClass::Values(ValueClass::OneRandom),
        |c| {
            c.cycles = false;
            c.floor = false;
        },
    );
    assert!(max_t(&r) < 10.0, "one-random: max |t| {}", max_t(&r));
}

#[test]
fn floor_control_runs_with_its_cycle_timer() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("floor_control_runs_with_its_cycle_timer") else {
        return;
    };
    let r = measure_with(
        &ctx,
        false,
        None,
        FixedClass::Values(ValueClass::Zeros),
        |c| {
            c.floor_kernel = true;
            c.floor = false;
        },
    );
    check_cycles(r.cycles.as_ref().expect("cycle timer measured"));
    assert!(r.floor.is_none());
}

#[test]
fn early_exit_control_is_caught() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("early_exit_control_is_caught") else {
        return;
    };
    let r = measure(
        &ctx,
        false,
        Some(LeakyControl::EarlyExitOnZeroQ),
        FixedClass::Values(ValueClass::Zeros),
    );
    assert!(
        max_t(&r) > 10.0,
        "control not caught: max |t| {}",
        max_t(&r)
    );
    // Zero Q exits at once: the fixed class is the faster one.
    assert!(r.fixed_us.unwrap().median < r.random_us.unwrap().median);
}

#[test]
fn secret_length_shipped_passes_and_control_is_caught() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("secret_length_shipped_passes_and_control_is_caught") else {
        return;
    };
    let class = FixedClass::Length(LengthClass::Zero);
    let shipped = measure(&ctx, true, None, class);
    assert!(
        max_t(&shipped) < 10.0,
        "shipped secret-length kernel: max |t| {} ({:?})",
        max_t(&shipped),
        shipped.analysis
    );
    assert!(shipped.floor.is_none(), "no floor in secret-length mode");
    let control = measure(&ctx, true, Some(LeakyControl::SkipPastSecretLength), class);
    assert!(
        max_t(&control) > 10.0,
        "control not caught: max |t| {}",
        max_t(&control)
    );
    // The cycle timer's power check: skipping key blocks is a difference in cycles.
    let c = control.cycles.as_ref().expect("cycle timer measured");
    check_cycles(c);
    let cycles_t = c.cycles.max_abs_t().unwrap();
    assert!(cycles_t > 10.0, "control not caught in cycles: {cycles_t}");
    assert!(c.fixed_cycles.unwrap().median < c.random_cycles.unwrap().median);
    // No floor under a control: nothing can clear it.
    assert!(control.floor.is_none() && control.evidence().floor_cycles_t.is_none());
    assert_eq!(control.attribution, Attribution::CycleLeak);
    assert!(!control.attribution.passes());
}

/// Decode mode: B = 2, 8 query heads over 2 K/V heads, one new query, a cache of 4096, D = 128
/// (two kernels per call: 4096 keys split in 16).
fn measure_decode(ctx: &Context, decode: DecodeConfig, class: LengthClass) -> ClassResult {
    let mut p = AttentionParams::new(2, 8, 4096, 128);
    p.seqlen_q = 1;
    p.heads_kv = 2;
    let mut cfg = LeakageConfig::new(p);
    cfg.secret_len = true;
    cfg.decode = Some(decode);
    cfg.cycles = false;
    cfg.floor = false;
    cfg.measurements = MEASUREMENTS;
    cfg.warmup = 500;
    let mut h = Harness::new(ctx, cfg).expect("decode harness");
    let r = h
        .run_class(FixedClass::Length(class))
        .expect("decode measurement");
    eprintln!(
        "decode {}:\n{}",
        decode.describe(),
        format_table(std::slice::from_ref(&r))
    );
    assert_eq!(r.measurements, MEASUREMENTS);
    let (f, rnd) = (r.fixed_us.unwrap(), r.random_us.unwrap());
    assert!(
        f.n > MEASUREMENTS / 3 && rnd.n > MEASUREMENTS / 3,
        "interleaving"
    );
    assert!(f.min > 0.0 && f.median < 10_000.0, "{f:?} {rnd:?}");
    assert!(r.cycles.is_none() && r.floor.is_none());
    r
}

#[test]
fn decode_secret_counts_pass_and_public_counts_are_caught() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("decode_secret_counts_pass_and_public_counts_are_caught") else {
        return;
    };
    let secret = measure_decode(&ctx, DecodeConfig::secret(), LengthClass::Zero);
    assert!(
        max_t(&secret) < 10.0,
        "secret counts: max |t| {} ({:?})",
        max_t(&secret),
        secret.analysis
    );
    let paged = DecodeConfig {
        page_size: Some(64),
        shuffled_pages: true,
        ..DecodeConfig::secret()
    };
    let r = measure_decode(&ctx, paged, LengthClass::Zero);
    assert!(
        max_t(&r) < 10.0,
        "paged secret counts: max |t| {}",
        max_t(&r)
    );
    // The power check: public counts end the walk at each count, so empty caches are faster.
    let public = DecodeConfig {
        secret_counts: false,
        ..DecodeConfig::secret()
    };
    let r = measure_decode(&ctx, public, LengthClass::Zero);
    assert!(
        max_t(&r) > 10.0,
        "public counts not caught: max |t| {}",
        max_t(&r)
    );
    assert!(r.fixed_us.unwrap().median < r.random_us.unwrap().median);
    assert_eq!(r.attribution, Attribution::Unattributed);
    assert!(!r.attribution.passes());
}
