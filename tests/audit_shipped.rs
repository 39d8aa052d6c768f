//! CI gate (docs/design.md §1, §5): every shipped kernel variant audits clean — no finding, no spill
//! (LDL/STL), and the forward kernel uses wgmma (HGMMA). Needs NVRTC and nvdisasm
//! (`bash scripts/install-cuda-tools.sh`); fails, never skips, without them.

#[test]
fn shipped_variants_are_data_oblivious_spill_free_and_use_wgmma() {
    let audits =
        flashcore::shipped::audit_shipped().unwrap_or_else(|e| panic!("audit failed: {e}"));
    let variants = flashcore::kernels::shipped_variants();
    let decode = variants.iter().filter(|v| v.decode).count();
    assert!(decode > 0, "decode variants are shipped");
    let kv_cache = variants.iter().filter(|v| v.is_kv_cache()).count();
    assert!(kv_cache > 0, "KV-cache variants are shipped");
    let varlen = variants.iter().filter(|v| v.varlen).count();
    assert!(varlen > 0, "varlen variants are shipped");
    let backward = flashcore::kernels::backward::shipped_bwd_variants().len();
    assert_eq!(
        audits.len(),
        variants.len() + decode + kv_cache + varlen + 4 * backward,
        "one audited kernel per shipped variant, two (forward and combine) per decode variant, \
         a third (the append) per KV-cache variant, two (forward and work-list builder) per \
         varlen variant, four (preprocess, dK/dV, dQ, dsink; or preprocess, one-pass, dQ conversion, \
         dsink) per backward variant"
    );
    // The append kernel is audited with its counts and table declared public.
    assert_eq!(
        audits
            .iter()
            .filter(|a| a.name == flashcore::kernels::APPEND_SYMBOL)
            .count(),
        kv_cache
    );
    // The varlen work-list builder is audited with its metadata pointers declared public.
    assert_eq!(
        audits
            .iter()
            .filter(|a| a.name == flashcore::kernels::VARLEN_BUILD_SYMBOL)
            .count(),
        varlen
    );
    // The combine kernel is audited too (it reads the secret partials).
    assert_eq!(
        audits
            .iter()
            .filter(|a| a.name == flashcore::kernels::COMBINE_SYMBOL)
            .count(),
        decode
    );
    let mut failures = Vec::new();
    for a in &audits {
        for why in flashcore::shipped::gate_failures(a) {
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

/// ptxas packed predicates into bits of one register in the d64 causal 192-row builds of the
/// forward as it stood before the turn chain across tiles (kept here as cubins, since later
/// kernel changes let ptxas choose otherwise) — `@P4 LOP3.LUT R8, R8, 0x40000000, ..` with a
/// secret P4, then `LOP3.LUT P0, RZ, R8, 0x10000000, ..` extracting a public bit. Bit-precise
/// taint must see the extracted predicate as public: these cubins audit with zero findings.
#[test]
fn packed_predicate_bits_are_tracked_precisely_in_m192_causal_variants() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/audit_corpus");
    for name in [
        "packed_predicates_d64_causal_m192_f16",
        "packed_predicates_d64_causal_m192_bf16",
    ] {
        let cubin = std::fs::read(dir.join(format!("{name}.cubin")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let listing = flashcore::audit::disassemble(&cubin).unwrap_or_else(|e| panic!("{e}"));
        // The pattern is really there: a guarded in-place OR of one bit and a bit extraction.
        assert!(
            listing.contains("LOP3.LUT P0, RZ, R") && listing.contains(", RZ, 0xfc, !PT"),
            "{name}: the packed-predicate pattern is not in the SASS"
        );
        let audits = flashcore::audit::audit_cubin(&cubin, &[])
            .unwrap_or_else(|e| panic!("{name}: audit failed: {e}"));
        assert_eq!(audits.len(), 1);
        assert!(
            audits[0].findings.is_empty(),
            "{name}: {:#?}",
            audits[0].findings
        );
    }
}
