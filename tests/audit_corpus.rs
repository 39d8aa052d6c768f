//! The auditor is trusted only as far as its planted-leak corpus shows (docs/design.md §5): every
//! planted leak in tests/audit_corpus/ must be flagged with the right rule at the right kind of
//! instruction, and every clean pattern must pass with zero findings. The SASS of each corpus
//! kernel is checked to contain the pattern it is meant to exercise, so a compiler change that
//! optimises a leak away fails here instead of passing silently.
//!
//! Needs NVRTC and nvdisasm (`bash scripts/install-cuda-tools.sh`); fails, never skips, without.

use flashcore::audit::{self, sass, KernelAudit, Rule};
use std::collections::HashMap;

fn corpus(file: &str) -> String {
    let p = format!("{}/tests/audit_corpus/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn cubin(file: &str) -> Vec<u8> {
    flashcore::jit::compile_cached(file, &corpus(file), &[], &flashcore::jit::base_options())
        .unwrap_or_else(|e| panic!("compiling {file}: {e}"))
}

fn audit(
    file: &str,
    secret: &[usize],
) -> (HashMap<String, KernelAudit>, HashMap<String, sass::Section>) {
    let bin = cubin(file);
    let audits =
        audit::audit_cubin(&bin, secret).unwrap_or_else(|e| panic!("auditing {file}: {e}"));
    let listing = audit::disassemble(&bin).unwrap_or_else(|e| panic!("{e}"));
    let secs = sass::parse_listing(&listing)
        .into_iter()
        .map(|s| (s.kernel.clone(), s))
        .collect();
    (
        audits.into_iter().map(|a| (a.name.clone(), a)).collect(),
        secs,
    )
}

fn has_op(sec: &sass::Section, pred: impl Fn(&sass::Insn) -> bool) -> bool {
    sec.insns.iter().any(pred)
}

/// (kernel, rule, base opcode of an instruction the rule must be reported at)
const LEAKS: &[(&str, Rule, &str)] = &[
    ("leak_branch", Rule::ControlFlow, "BRA"),
    ("leak_early_exit", Rule::ControlFlow, "EXIT"),
    ("leak_loop_trip", Rule::ControlFlow, "BRA"),
    ("leak_pred_load", Rule::MemoryAddress, "LDG"),
    ("leak_pred_store", Rule::MemoryAddress, "STG"),
    ("leak_global_addr", Rule::MemoryAddress, "LDG"),
    ("leak_shared_addr", Rule::MemoryAddress, "LDS"),
    ("leak_atomic_addr", Rule::MemoryAddress, "RED"),
    ("leak_ieee_div", Rule::VariableLatency, "FCHK"),
    ("leak_ieee_sqrt", Rule::VariableLatency, "CALL"),
    ("leak_div64", Rule::VariableLatency, "CALL"),
    ("leak_vote_branch", Rule::ControlFlow, "BRA"),
    ("leak_smem_roundtrip", Rule::ControlFlow, "BRA"),
    ("leak_packed_pred_branch", Rule::ControlFlow, "BRA"),
];

/// The kernel builds a word from predicates (a select of the secret bit) and reads one bit of a
/// register back into a predicate (`LOP3.LUT Px, RZ, Rn, imm, ...` or `R2P`).
fn packs_and_extracts_bits(sec: &sass::Section) -> bool {
    let builds = has_op(sec, |i| {
        matches!(i.op(), "SEL" | "P2R" | "LOP3") && i.text.contains("0x40000000")
    });
    let extracts = has_op(sec, |i| {
        i.op() == "R2P"
            || (i.op() == "LOP3"
                && i.operands
                    .first()
                    .and_then(|o| o.as_reg())
                    .map(|r| r.reg.is_pred())
                    .unwrap_or(false)
                && i.operands
                    .get(2)
                    .and_then(|o| o.as_reg())
                    .map(|r| r.reg.is_gpr() && r.reg != sass::Reg::Zero)
                    .unwrap_or(false))
    });
    builds && extracts
}

fn base_op(text: &str) -> &str {
    let t = text
        .split_whitespace()
        .find(|t| !t.starts_with('@'))
        .unwrap_or("");
    t.split('.').next().unwrap_or("")
}

fn assert_flagged(a: &KernelAudit, rule: Rule, op: &str) {
    assert!(
        a.findings
            .iter()
            .any(|f| f.rule == rule && (base_op(&f.text) == op || base_op(&f.text).starts_with(op))),
        "{}: expected a rule-{} finding at a {op} instruction; got {:#?}",
        a.name,
        rule.number(),
        a.findings
    );
    for f in &a.findings {
        assert!(f.offset > 0 || !f.text.is_empty());
    }
}

#[test]
fn every_planted_leak_is_flagged_with_its_rule() {
    let (audits, secs) = audit("leaks.cu", &[]);
    assert_eq!(
        audits.len(),
        LEAKS.len(),
        "kernels: {:?}",
        audits.keys().collect::<Vec<_>>()
    );
    for (name, rule, op) in LEAKS {
        let a = audits
            .get(*name)
            .unwrap_or_else(|| panic!("kernel {name} missing"));
        assert_flagged(a, *rule, op);
        // A finding carries its taint chain back to a global load (the secret source).
        let f = a.findings.iter().find(|f| f.rule == *rule).unwrap();
        if *name != "leak_smem_roundtrip" {
            assert!(
                f.chain
                    .first()
                    .map(|s| base_op(&s.text) == "LDG")
                    .unwrap_or(false),
                "{name}: chain should start at the LDG: {:#?}",
                f.chain
            );
        }
    }
    // The SASS contains the intended pattern, not something the compiler turned it into.
    let s = |k: &str| &secs[k];
    assert!(has_op(s("leak_pred_load"), |i| i.op() == "LDG"
        && i.real_guard().is_some()));
    assert!(has_op(s("leak_pred_store"), |i| i.op() == "STG"
        && i.real_guard().is_some()));
    assert!(has_op(s("leak_early_exit"), |i| i.op() == "EXIT"
        && i.real_guard().is_some()));
    assert!(has_op(s("leak_vote_branch"), |i| i.op() == "VOTE"));
    assert!(has_op(s("leak_ieee_div"), |i| i.op() == "FCHK"));
    assert!(has_op(s("leak_ieee_div"), |i| i.op() == "CALL"));
    assert!(has_op(s("leak_ieee_sqrt"), |i| i
        .text
        .contains("sqrt_rn_f32_slowpath")));
    assert!(has_op(s("leak_div64"), |i| i.text.contains("div_s64")));
    assert!(has_op(s("leak_smem_roundtrip"), |i| i.op() == "STS"));
    assert!(has_op(s("leak_smem_roundtrip"), |i| i.op() == "LDS"));
    assert!(packs_and_extracts_bits(s("leak_packed_pred_branch")));
}

#[test]
fn shared_memory_round_trip_chain_goes_through_the_store() {
    let (audits, _) = audit("leaks.cu", &[]);
    let a = &audits["leak_smem_roundtrip"];
    let f = a
        .findings
        .iter()
        .find(|f| f.rule == Rule::ControlFlow)
        .unwrap();
    let ops: Vec<&str> = f.chain.iter().map(|s| base_op(&s.text)).collect();
    let (ldg, sts, lds) = (
        ops.iter().position(|o| *o == "LDG"),
        ops.iter().position(|o| *o == "STS"),
        ops.iter().position(|o| *o == "LDS"),
    );
    assert!(ldg < sts && sts < lds && ldg.is_some(), "chain {ops:?}");
}

#[test]
fn secret_parameter_as_loop_bound_is_flagged() {
    let (audits, _) = audit("leak_secret_param.cu", &[2]);
    let a = &audits["leak_secret_param_loop"];
    assert_flagged(a, Rule::ControlFlow, "BRA");
    let f = a
        .findings
        .iter()
        .find(|f| f.rule == Rule::ControlFlow)
        .unwrap();
    assert!(
        f.chain
            .first()
            .map(|s| s.text.contains("c[0x0][0x220]"))
            .unwrap_or(false),
        "chain should start at the read of parameter 2: {:#?}",
        f.chain
    );
    // The same kernel with the parameter public is clean: the taint comes from the parameter.
    let (public, _) = audit("leak_secret_param.cu", &[]);
    assert!(public["leak_secret_param_loop"].findings.is_empty());
}

#[test]
fn clean_patterns_have_no_findings() {
    let (audits, secs) = audit("clean.cu", &[]);
    assert_eq!(audits.len(), 7);
    for a in audits.values() {
        assert!(a.findings.is_empty(), "{}: {:#?}", a.name, a.findings);
    }
    let s = |k: &str| &secs[k];
    assert!(has_op(s("clean_select_mask"), |i| matches!(
        i.op(),
        "FSEL" | "SEL" | "FMNMX" | "IMNMX" | "VIMNMX"
    )));
    assert!(has_op(s("clean_shuffle_reduce"), |i| i.op() == "SHFL"));
    assert!(has_op(s("clean_shuffle_reduce"), |i| i.op() == "FMNMX"));
    assert!(has_op(s("clean_exp2_softmax"), |i| i
        .opcode
        .starts_with("MUFU.EX2")));
    assert!(has_op(s("clean_exp2_softmax"), |i| i
        .opcode
        .starts_with("MUFU.RCP")));
    assert!(has_op(s("clean_smem_staging"), |i| i.op() == "LDS"));
    assert!(!has_op(s("clean_int_div_public"), |i| i.op() == "CALL"));
    assert!(packs_and_extracts_bits(s("clean_packed_pred_branch")));
    // The public bit really drives a branch (not a select).
    assert!(has_op(s("clean_packed_pred_branch"), |i| i.op() == "BRA"
        && i.real_guard().is_some()));
}

#[test]
fn tma_wgmma_mbarrier_kernel_is_clean() {
    let (audits, secs) = audit("clean_tma_wgmma.cu", &[]);
    let a = &audits["clean_tma_wgmma"];
    assert!(a.findings.is_empty(), "{:#?}", a.findings);
    let r = &a.resources;
    assert!(
        r.hgmma >= 1 && r.tma >= 1 && r.mbarrier_waits >= 1 && r.mufu_ex2 >= 1,
        "{r:?}"
    );
    assert_eq!(r.spills, 0);
    let s = &secs["clean_tma_wgmma"];
    assert!(has_op(s, |i| i.opcode.starts_with("USETMAXREG")));
    assert!(has_op(s, |i| i.opcode.contains("TRYWAIT")));
    assert!(has_op(s, |i| i.op() == "UTMALDG"));
    // The try-wait retry branches exist and are counted public.
    assert!(r.branches_public >= 2 && r.branches_secret == 0);
}

#[test]
fn secret_length_used_only_in_selects_is_clean() {
    let (audits, secs) = audit("clean_secret_len.cu", &[2]);
    let a = &audits["clean_secret_len"];
    assert!(a.findings.is_empty(), "{:#?}", a.findings);
    // The secret parameter is really read and really feeds a select.
    assert!(has_op(&secs["clean_secret_len"], |i| i
        .text
        .contains("c[0x0][0x220]")));
    assert!(has_op(&secs["clean_secret_len"], |i| matches!(
        i.op(),
        "FSEL" | "SEL"
    )));
}

#[test]
fn resource_report_reads_the_elf() {
    let (audits, _) = audit("clean_tma_wgmma.cu", &[]);
    let a = &audits["clean_tma_wgmma"];
    assert!(a.resources.registers.unwrap_or(0) >= 24);
    assert!(a.resources.static_shared_bytes > 0);
    // Parameters: 128-byte tensor map, a pointer, an int.
    let sizes: Vec<u32> = a.params.iter().map(|p| p.size).collect();
    assert_eq!(sizes, vec![128, 8, 4]);
}
