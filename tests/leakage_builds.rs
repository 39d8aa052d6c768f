//! The timing test's measurement builds, compiled and audited on the CPU (needs NVRTC
//! and nvdisasm: `bash scripts/install-cuda-tools.sh`; fails, never skips, without them):
//! - the cycle-timer build of the shipped source audits clean (its instrumentation is
//!   public-only) and really reads the SM clock and the global timer;
//! - the hardware-floor build audits clean too (no secret reaches a branch or an address: it is
//!   the shipped kernel with its scores replaced by a public pattern) and keeps the shipped TMA
//!   loads, GEMMs and exponentials (same `UTMALDG`, `HGMMA` and `MUFU.EX2` counts: ptxas dropped
//!   the Q Kᵀ GEMM of an earlier version whose result had no use);
//! - the floor with the cycle timer (measured beside the shipped kernel's cycle-timer build)
//!   audits clean, reads the clocks and keeps the floor's loads, GEMMs and exponentials;
//! - all three stay clean and spill-free on the other tile shapes;
//! - neither is ever shipped, and the queued-timing wait kernel audits clean and reads no data.

use flashcore::audit::{audit_cubin, audit_cubin_with, disassemble, KernelAudit};
use flashcore::kernels::{shipped_variants, KernelBuild, TestBuild, Variant};
use flashcore::DType;

fn shipped_d64() -> Variant {
    Variant::for_shape(DType::F16, 64, false, false, 512, 512)
}

fn build(v: impl Into<KernelBuild>) -> (Vec<u8>, String, KernelAudit) {
    let v = v.into();
    let cubin = v.cubin().unwrap_or_else(|e| panic!("{}: {e}", v.name()));
    let listing = disassemble(&cubin).unwrap_or_else(|e| panic!("{e}"));
    // With the variant's declarations (its secret parameters, and public buffers such as the
    // dynamic tile order's counter), as the shipped audit does.
    let mut audits = audit_cubin_with(
        &cubin,
        &v.variant.declared(flashcore::kernels::FORWARD_SYMBOL),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(audits.len(), 1, "{}: one kernel", v.name());
    (cubin, listing, audits.remove(0))
}

fn assert_gate(v: &KernelBuild, a: &KernelAudit) {
    let fails = flashcore::shipped::gate_failures(a);
    assert!(
        fails.is_empty(),
        "{}: {fails:?}\n{}",
        v.name(),
        a.findings
            .iter()
            .map(|f| f.text.clone())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn count(listing: &str, needle: &str) -> usize {
    listing.matches(needle).count()
}

#[test]
fn cycle_timer_build_audits_clean_and_reads_the_clocks() {
    for secret_len in [false, true] {
        let shipped = Variant::for_shape(DType::F16, 64, false, secret_len, 512, 512);
        let timed = TestBuild {
            cycle_timer: true,
            ..TestBuild::default()
        }
        .apply(shipped);
        assert!(timed.test.cycle_timer && timed.name().ends_with("_CYCLES"));
        let (_, listing, audit) = build(timed);
        assert_gate(&timed, &audit);
        assert!(
            listing.contains("SR_CLOCKLO") && listing.contains("SR_GLOBALTIMERLO"),
            "{}: no clock reads in the SASS",
            timed.name()
        );
        // Same GEMMs and TMA loads as the shipped build.
        let (_, shipped_listing, shipped_audit) = build(shipped);
        assert_eq!(audit.resources.hgmma, shipped_audit.resources.hgmma);
        assert_eq!(audit.resources.tma, shipped_audit.resources.tma);
        assert!(!shipped_listing.contains("SR_GLOBALTIMERLO"));
    }
}

#[test]
fn floor_build_audits_clean_with_the_shipped_loads_and_gemms() {
    let shipped = shipped_d64();
    for cycle_timer in [false, true] {
        let floor = TestBuild {
            floor_control: true,
            cycle_timer,
            ..TestBuild::default()
        }
        .apply(shipped);
        let (_, listing, audit) = build(floor);
        assert_gate(&floor, &audit);
        let (_, shipped_listing, shipped_audit) = build(shipped);
        assert_eq!(
            audit.resources.hgmma, shipped_audit.resources.hgmma,
            "same GEMMs"
        );
        assert_eq!(
            audit.resources.tma, shipped_audit.resources.tma,
            "same TMA loads"
        );
        assert_ne!(
            listing, shipped_listing,
            "the floor build is a different kernel"
        );
        // The softmax still runs: as many exponentials per block as the shipped kernel.
        assert_eq!(
            count(&listing, "MUFU.EX2"),
            count(&shipped_listing, "MUFU.EX2"),
            "the floor's softmax does the shipped amount of exp2 work"
        );
        // The floor's cycle-timer build (measured beside the shipped kernel's) reads the clocks
        // like the shipped cycle-timer build and keeps the floor's hook.
        if cycle_timer {
            assert!(floor.test.floor_control && floor.name().ends_with("_FLOOR_CYCLES"));
            assert!(
                listing.contains("SR_CLOCKLO") && listing.contains("SR_GLOBALTIMERLO"),
                "{}: no clock reads in the SASS",
                floor.name()
            );
            let plain_floor = TestBuild {
                floor_control: true,
                ..TestBuild::default()
            }
            .apply(shipped);
            let (_, plain_listing, _) = build(plain_floor);
            assert_eq!(
                count(&listing, "MUFU.EX2"),
                count(&plain_listing, "MUFU.EX2")
            );
            assert!(!plain_listing.contains("SR_GLOBALTIMERLO"));
        }
    }
}

/// The cycle timer's power check times the skip-past-length control with the timer built in: it
/// compiles, the control's leak is still flagged, and the clocks are read.
#[test]
fn leaky_control_with_cycle_timer_builds_and_is_flagged() {
    let shipped = Variant::for_shape(DType::F16, 64, false, true, 512, 512);
    let v = TestBuild {
        leaky_control: Some(flashcore::kernels::LeakyControl::SkipPastSecretLength),
        cycle_timer: true,
        ..TestBuild::default()
    }
    .apply(shipped);
    let (_, listing, audit) = build(v);
    assert!(listing.contains("SR_CLOCKLO"));
    assert!(
        audit
            .findings
            .iter()
            .any(|f| f.rule == flashcore::audit::Rule::ControlFlow),
        "the control's leak must still be flagged"
    );
}

/// Beyond the default shape: the measurement builds (the floor, the cycle timer, and the floor
/// with the cycle timer, as `flashcore leakage` measures it beside the shipped kernel) stay clean
/// and spill-free on the other tile shapes (d128, bf16, causal, secret length, and 192-row tiles at 128 registers per thread,
/// where a careless hook spills).
#[test]
fn measurement_builds_are_clean_and_spill_free_across_tile_shapes() {
    // The last flag: the launch is small enough for light 64-row tiles (one batch entry of 8
    // heads on 132 SMs), as `flashcore leakage`'s default shape is.
    let shapes = [
        (DType::F16, 128, false, false, 512, false),
        (DType::Bf16, 64, true, false, 512, false),
        (DType::F16, 64, false, false, 2048, false),
        (DType::F16, 64, true, false, 8192, false),
        (DType::F16, 128, true, true, 1024, false),
        (DType::F16, 64, false, false, 512, true),
        (DType::Bf16, 128, true, false, 512, true),
    ];
    for (dtype, d, causal, secret_len, s, light) in shapes {
        let mut shipped = Variant::for_shape(dtype, d, causal, secret_len, s, s);
        if light {
            shipped = shipped.with_light_tiles(1, 8, s, 132);
            assert_eq!(shipped.block_m, 64, "{}", shipped.name());
        }
        for (floor_control, cycle_timer) in [(true, false), (false, true), (true, true)] {
            let v = TestBuild {
                floor_control,
                cycle_timer,
                ..TestBuild::default()
            }
            .apply(shipped);
            let (_, _, audit) = build(v);
            assert_gate(&v, &audit);
        }
    }
}

#[test]
fn measurement_builds_are_never_shipped() {
    // A shipped variant compiles with no measurement define and the leaky control off.
    assert!(shipped_variants().iter().all(|v| {
        let o = v.options();
        o.contains(&"-DFC_LEAKY_CONTROL=0".to_string())
            && !o
                .iter()
                .any(|o| o.contains("FC_FLOOR_CONTROL") || o.contains("FC_CYCLE_TIMER"))
    }));
    let v = shipped_d64();
    assert_eq!(TestBuild::default().apply(v), KernelBuild::from(v));
    assert!(TestBuild::default().is_shipped());
    let f = TestBuild {
        floor_control: true,
        ..TestBuild::default()
    };
    assert!(!f.is_shipped());
    assert_eq!(f.apply(v).variant.split, 1);
    assert!(f
        .apply(v)
        .options()
        .contains(&"-DFC_FLOOR_CONTROL=1".to_string()));
    assert!(!v
        .options()
        .iter()
        .any(|o| o.contains("FC_FLOOR_CONTROL") || o.contains("FC_CYCLE_TIMER")));
}

#[test]
fn spin_kernel_audits_clean() {
    let cubin = flashcore::kernels::spin_cubin().unwrap_or_else(|e| panic!("{e}"));
    let audits = audit_cubin(&cubin, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(audits.len(), 1);
    assert!(audits[0].is_clean(), "{:?}", audits[0].findings);
    let listing = disassemble(&cubin).unwrap();
    assert!(listing.contains("SR_GLOBALTIMERLO"));
    assert!(!listing.contains("LDG"), "the wait reads no data");
}
