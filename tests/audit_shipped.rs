//! CI gate (DESIGN.md §1, §5): every shipped kernel variant audits clean — no finding, no spill
//! (LDL/STL), and the forward kernel uses wgmma (HGMMA). Needs NVRTC and nvdisasm
//! (`bash scripts/install-cuda-tools.sh`); fails, never skips, without them.

#[test]
fn shipped_variants_are_data_oblivious_spill_free_and_use_wgmma() {
    let audits = flashcore::audit::audit_shipped().unwrap_or_else(|e| panic!("audit failed: {e}"));
    assert_eq!(
        audits.len(),
        flashcore::kernels::shipped_variants().len(),
        "one audited kernel per shipped variant"
    );
    let mut failures = Vec::new();
    for a in &audits {
        for why in a.gate_failures() {
            failures.push(format!(
                "{}: {why}",
                a.variant.as_deref().unwrap_or(&a.name)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "audit gate failed:\n  {}\n\n{}",
        failures.join("\n  "),
        flashcore::audit::report::render_table(&audits)
    );
}
