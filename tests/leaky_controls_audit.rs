//! The deliberately leaky control kernels (the power control of `flashcore leakage`) must be
//! flagged by the static audit, each with a control-flow finding: they are built from the same
//! source as the shipped kernels, so this also shows the audit sees the real kernel's code paths.

use flashcore::audit::{audit_cubin, Rule};
use flashcore::kernels::{LeakyControl, TestBuild, Variant};
use flashcore::DType;

fn findings_of(control: LeakyControl) -> Vec<flashcore::audit::Finding> {
    let secret_len = control == LeakyControl::SkipPastSecretLength;
    let v = TestBuild {
        leaky_control: Some(control),
        ..TestBuild::default()
    }
    .apply(Variant {
        secret_len,
        ..Variant::basic(DType::F16, 64, false, 128)
    });
    let cubin = v.cubin().unwrap_or_else(|e| panic!("{}: {e}", v.name()));
    audit_cubin(&cubin, &[])
        .unwrap()
        .into_iter()
        .flat_map(|k| k.findings)
        .collect()
}

#[test]
fn early_exit_control_is_flagged() {
    let f = findings_of(LeakyControl::EarlyExitOnZeroQ);
    assert!(
        f.iter().any(|f| f.rule == Rule::ControlFlow),
        "expected a control-flow finding, got {:?}",
        f.iter().map(|f| (&f.text, f.rule)).collect::<Vec<_>>()
    );
}

#[test]
fn skip_past_secret_length_control_is_flagged() {
    let f = findings_of(LeakyControl::SkipPastSecretLength);
    assert!(
        f.iter().any(|f| f.rule == Rule::ControlFlow),
        "expected a control-flow finding, got {:?}",
        f.iter().map(|f| (&f.text, f.rule)).collect::<Vec<_>>()
    );
}

#[test]
fn controls_are_not_shipped() {
    assert!(flashcore::kernels::shipped_variants()
        .iter()
        .all(|v| v.options().contains(&"-DFC_LEAKY_CONTROL=0".to_string())));
}
