//! The leakage test on a real GPU, with its power control: the shipped kernel passes, the
//! deliberately leaky control kernels fail (a test that cannot fail proves nothing). Skips
//! visibly without a GPU; fails instead when FLASHCORE_REQUIRE_GPU=1.
//!
//! The bound here is |t| < 10 for the shipped kernel (robust at 20 000 measurements); the CLI's
//! verdict threshold stays 4.5.

mod common;
use common::gpu;
use flashcore::attention::{AttentionParams, Context};
use flashcore::kernels::LeakyControl;
use flashcore::leakage::report::format_table;
use flashcore::leakage::{
    ClassResult, FixedClass, Harness, LeakageConfig, LengthClass, ValueClass,
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
    let mut cfg = LeakageConfig::new(AttentionParams::new(1, 8, 512, 64));
    cfg.secret_len = secret_len;
    cfg.control = control;
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

fn max_t(r: &ClassResult) -> f64 {
    r.analysis.max_abs_t().expect("tests were made")
}

#[test]
fn shipped_kernel_zeros_vs_random_shows_no_leak() {
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ctx) = gpu("shipped_kernel_zeros_vs_random_shows_no_leak") else {
        return;
    };
    let r = measure(&ctx, false, None, FixedClass::Values(ValueClass::Zeros));
    assert!(
        max_t(&r) < 10.0,
        "shipped kernel: max |t| {} ({:?})",
        max_t(&r),
        r.analysis
    );
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
    let control = measure(&ctx, true, Some(LeakyControl::SkipPastSecretLength), class);
    assert!(
        max_t(&control) > 10.0,
        "control not caught: max |t| {}",
        max_t(&control)
    );
}
