//! The adversarial corpus: cross-lane and cross-thread leaks
//! (tests/audit_corpus/leaks_cross_lane.cu), memory-side and latency-side leaks
//! (leaks_more.cu) and clean-but-tricky kernels (clean_tricky.cu). For each kernel the test
//! asserts
//! * the verdict: every leak is flagged with the expected rule at the expected kind of
//!   instruction, with a taint chain; every clean kernel has no finding;
//! * the SASS witness: the instruction that makes the case what it is (the vote, the shuffle
//!   with a register lane, the barrier reduction, the local spill, the slow-path call, ...) is
//!   really in the compiled code, so a compiler change that optimises a case away is noticed
//!   instead of passing silently.
//!
//! docs/security.md explains, per case, why it is or is not a leak under the threat model.
//! Needs NVRTC and nvdisasm (`bash scripts/install-cuda-tools.sh`); fails, never skips, without.

use flashcore::audit::{self, sass, KernelAudit, Rule};
use std::collections::HashMap;

type Witness = fn(&sass::Section) -> bool;

fn corpus(file: &str) -> String {
    let p = format!("{}/tests/audit_corpus/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn audit(file: &str) -> (HashMap<String, KernelAudit>, HashMap<String, sass::Section>) {
    let bin =
        flashcore::jit::compile_cached(file, &corpus(file), &[], &flashcore::jit::base_options())
            .unwrap_or_else(|e| panic!("compiling {file}: {e}"));
    let audits = audit::audit_cubin(&bin, &[]).unwrap_or_else(|e| panic!("auditing {file}: {e}"));
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

/// The opcode of an instruction's text, past its guard.
fn base_op(text: &str) -> &str {
    text.split_whitespace()
        .find(|t| !t.starts_with('@'))
        .unwrap_or("")
}

fn any(sec: &sass::Section, pred: impl Fn(&sass::Insn) -> bool) -> bool {
    sec.insns.iter().any(pred)
}
fn op_is(i: &sass::Insn, opcode_prefix: &str) -> bool {
    i.opcode == opcode_prefix || i.opcode.starts_with(&format!("{opcode_prefix}."))
}
fn has(sec: &sass::Section, opcode_prefix: &str) -> bool {
    any(sec, |i| op_is(i, opcode_prefix))
}
fn reg_operand(i: &sass::Insn, k: usize) -> bool {
    i.operands
        .get(k)
        .and_then(|o| o.as_reg())
        .is_some_and(|r| r.reg.is_gpr() && r.reg != sass::Reg::Zero)
}
fn pred_operand(i: &sass::Insn, k: usize) -> bool {
    i.operands
        .get(k)
        .and_then(|o| o.as_reg())
        .is_some_and(|r| matches!(r.reg, sass::Reg::P(_) | sass::Reg::UP(_)))
}
fn calls(sec: &sass::Section, name_part: &str) -> bool {
    any(sec, |i| {
        i.op() == "CALL" && i.label_target().is_some_and(|l| l.contains(name_part))
    })
}
/// A backward branch: the kernel has a loop.
fn has_loop(sec: &sass::Section) -> bool {
    sec.insns.iter().enumerate().any(|(k, i)| {
        i.op() == "BRA"
            && i.label_target()
                .and_then(|l| sec.labels.get(l))
                .is_some_and(|&t| t < k)
    })
}

/// (kernel, rule, base opcode of the sink, SASS witness, what the witness is)
const LEAKS: &[(&str, Rule, &str, Witness, &str)] = &[
    // Cross-lane and cross-thread (leaks_cross_lane.cu).
    (
        "leak_vote_any_branch",
        Rule::ControlFlow,
        "BRA",
        |s| {
            any(s, |i| {
                op_is(i, "VOTE.ANY") && pred_operand(i, 0) && pred_operand(i, 1)
            })
        },
        "VOTE.ANY Pd, Ps",
    ),
    (
        "leak_vote_all_branch",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "VOTE.ALL") || has(s, "VOTEU.ALL"),
        "VOTE.ALL",
    ),
    (
        "leak_ballot_index",
        Rule::MemoryAddress,
        "LDG",
        |s| any(s, |i| i.op() == "VOTE" && reg_operand(i, 0)) && has(s, "POPC"),
        "VOTE.ANY Rd (ballot) + POPC",
    ),
    (
        "leak_match_any_index",
        Rule::MemoryAddress,
        "LDG",
        |s| has(s, "MATCH.ANY"),
        "MATCH.ANY",
    ),
    (
        "leak_match_all_branch",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "MATCH.ALL"),
        "MATCH.ALL",
    ),
    (
        "leak_redux_sum_index",
        Rule::MemoryAddress,
        "LDG",
        |s| has(s, "REDUX.SUM"),
        "REDUX.SUM",
    ),
    (
        "leak_redux_max_loop",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "REDUX.MAX"),
        "REDUX.MAX",
    ),
    (
        "leak_shfl_data_index",
        Rule::MemoryAddress,
        "LDG",
        |s| has(s, "SHFL"),
        "SHFL",
    ),
    (
        "leak_shfl_secret_lane",
        Rule::MemoryAddress,
        "LDG",
        |s| any(s, |i| op_is(i, "SHFL.IDX") && reg_operand(i, 3)),
        "SHFL.IDX with a register lane",
    ),
    (
        "leak_bar_red_popc",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "BAR.RED.POPC") && has(s, "B2R"),
        "BAR.RED.POPC + B2R",
    ),
    (
        "leak_bar_red_or",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "BAR.RED.OR"),
        "BAR.RED.OR",
    ),
    (
        "leak_smem_cross_warp",
        Rule::ControlFlow,
        "BRA",
        |s| {
            let first = |o: &str| s.insns.iter().position(|i| i.op() == o);
            matches!((first("LDS"), first("STS")), (Some(l), Some(t)) if l < t)
        },
        "an LDS laid out before every STS",
    ),
    (
        "leak_atomic_return_index",
        Rule::MemoryAddress,
        "STG",
        |s| has(s, "ATOMG"),
        "ATOMG",
    ),
    (
        "leak_shared_atomic_return",
        Rule::MemoryAddress,
        "LDG",
        |s| has(s, "ATOMS"),
        "ATOMS",
    ),
    (
        "leak_atomic_cas_loop",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "ATOMG") && s.insns.iter().any(|i| i.opcode.contains("CAS")),
        "ATOMG.CAS",
    ),
    // Memory side, latency side, calls, indirect branches, selections (leaks_more.cu).
    (
        "leak_local_roundtrip",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "STL") && has(s, "LDL"),
        "STL + LDL",
    ),
    (
        "leak_ldmatrix_addr",
        Rule::MemoryAddress,
        "LDSM",
        |s| has(s, "LDSM"),
        "LDSM",
    ),
    (
        "leak_cp_async_addr",
        Rule::MemoryAddress,
        "LDGSTS",
        |s| has(s, "LDGSTS"),
        "LDGSTS",
    ),
    (
        "leak_tma_coord",
        Rule::MemoryAddress,
        "UTMALDG",
        |s| has(s, "UTMALDG"),
        "UTMALDG",
    ),
    (
        "leak_bar_count",
        Rule::ControlFlow,
        "BAR",
        |s| any(s, |i| i.op() == "BAR" && reg_operand(i, 1)),
        "BAR id, Rcount",
    ),
    (
        "leak_bar_id",
        Rule::ControlFlow,
        "BAR",
        |s| any(s, |i| i.op() == "BAR" && reg_operand(i, 0)),
        "BAR Rid",
    ),
    (
        "leak_bar_divergent",
        Rule::ControlFlow,
        "BAR",
        |s| any(s, |i| i.op() == "BAR" && i.real_guard().is_some()),
        "guarded BAR",
    ),
    (
        "leak_nanosleep",
        Rule::VariableLatency,
        "NANOSLEEP",
        |s| any(s, |i| i.op() == "NANOSLEEP" && reg_operand(i, 0)),
        "NANOSLEEP Rd",
    ),
    (
        "leak_warpsync_mask",
        Rule::ControlFlow,
        "WARPSYNC",
        |s| any(s, |i| i.op() == "WARPSYNC" && reg_operand(i, 0)),
        "WARPSYNC Rmask",
    ),
    (
        "leak_rem64",
        Rule::VariableLatency,
        "CALL",
        |s| calls(s, "rem_s64"),
        "CALL __cuda_sm20_rem_s64",
    ),
    (
        "leak_ieee_rcp",
        Rule::VariableLatency,
        "CALL",
        |s| calls(s, "rcp_rn_f32_slowpath"),
        "CALL rcp slow path",
    ),
    (
        "leak_ieee_ddiv",
        Rule::VariableLatency,
        "CALL",
        |s| calls(s, "div_rn_f64"),
        "CALL f64 division",
    ),
    (
        "leak_ieee_dsqrt",
        Rule::VariableLatency,
        "CALL",
        |s| calls(s, "dsqrt_rn_f64"),
        "CALL f64 sqrt",
    ),
    (
        "leak_f2i_index",
        Rule::MemoryAddress,
        "LDG",
        |s| has(s, "F2I"),
        "F2I",
    ),
    (
        "leak_exit_in_loop",
        Rule::ControlFlow,
        "EXIT",
        |s| has_loop(s) && any(s, |i| i.op() == "EXIT" && i.real_guard().is_some()),
        "guarded EXIT in a loop",
    ),
    (
        "leak_break_in_loop",
        Rule::ControlFlow,
        "BRA",
        has_loop,
        "a loop",
    ),
    (
        "leak_noinline_arg_branch",
        Rule::ControlFlow,
        "BRA",
        |s| calls(s, "callee_branches") && s.functions.len() > 1,
        "CALL of the __noinline__ callee",
    ),
    (
        "leak_noinline_return_index",
        Rule::MemoryAddress,
        "LDG",
        |s| calls(s, "callee_loads") && has(s, "RET"),
        "CALL + RET",
    ),
    (
        "leak_noinline_saved_reg",
        Rule::MemoryAddress,
        "LDG",
        |s| calls(s, "callee_busy"),
        "CALL",
    ),
    (
        "leak_indirect_call",
        Rule::ControlFlow,
        "CALL",
        |s| any(s, |i| i.op() == "CALL" && reg_operand(i, 0)),
        "CALL Rtarget",
    ),
    (
        "leak_switch_brx",
        Rule::ControlFlow,
        "BRX",
        |s| any(s, |i| i.op() == "BRX" && reg_operand(i, 0)),
        "BRX Rtarget",
    ),
    (
        "leak_min_bound",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "VIMNMX") || has(s, "IMNMX"),
        "IMNMX/VIMNMX",
    ),
    (
        "leak_sel_bound",
        Rule::ControlFlow,
        "BRA",
        |s| {
            has(s, "SEL")
                || any(s, |i| {
                    matches!(i.op(), "LDC" | "MOV" | "IMAD") && i.real_guard().is_some()
                })
        },
        "SEL (or its predicated-move form)",
    ),
    (
        "leak_prmt_index",
        Rule::MemoryAddress,
        "LDG",
        |s| has(s, "PRMT"),
        "PRMT",
    ),
    (
        "leak_pred_sts",
        Rule::MemoryAddress,
        "STS",
        |s| any(s, |i| i.op() == "STS" && i.real_guard().is_some()),
        "guarded STS",
    ),
    (
        "leak_const_index",
        Rule::MemoryAddress,
        "LDC",
        |s| {
            any(s, |i| {
                i.op() == "LDC"
                    && i.operands.iter().any(
                        |o| matches!(o, sass::Operand::CBank { index, .. } if !index.is_empty()),
                    )
            })
        },
        "LDC c[bank][Rindex]",
    ),
    (
        "leak_printf_secret",
        Rule::VariableLatency,
        "CALL",
        |s| any(s, |i| op_is(i, "CALL.ABS") && reg_operand(i, 0)),
        "CALL.ABS to vprintf",
    ),
    (
        "leak_malloc_size",
        Rule::VariableLatency,
        "CALL",
        |s| any(s, |i| op_is(i, "CALL.ABS") && reg_operand(i, 0)),
        "CALL.ABS to malloc",
    ),
    (
        "leak_trap",
        Rule::ControlFlow,
        "BRA",
        |s| has(s, "BPT.TRAP"),
        "BPT.TRAP",
    ),
    (
        "leak_tex_coord",
        Rule::MemoryAddress,
        "TLD",
        |s| has(s, "TLD") || has(s, "TEX"),
        "TLD/TEX",
    ),
    (
        "leak_bulk_copy_size",
        Rule::MemoryAddress,
        "UBLKCP",
        |s| any(s, |i| i.op() == "UBLKCP" && reg_operand(i, 2)),
        "UBLKCP with a size register",
    ),
    (
        "leak_dsmem_rank",
        Rule::MemoryAddress,
        "LD",
        |s| has(s, "UCGABAR_WAIT") && any(s, |i| i.op() == "LD"),
        "a generic load after a cluster barrier (the mapa'd address)",
    ),
    (
        "leak_smem_flag_spin",
        Rule::ControlFlow,
        "BRA",
        |s| has_loop(s) && has(s, "LDS"),
        "a loop around a shared load",
    ),
];

/// (kernel, SASS witness of what makes it look like a leak, what the witness is)
const CLEAN: &[(&str, Witness, &str)] = &[
    ("clean_vote_public", |s| has(s, "VOTE"), "VOTE"),
    (
        "clean_ballot_public_index",
        |s| any(s, |i| i.op() == "VOTE" && reg_operand(i, 0)),
        "ballot",
    ),
    ("clean_shuffle_public_index", |s| has(s, "SHFL"), "SHFL"),
    (
        "clean_bar_count_public",
        |s| has(s, "BAR.RED.POPC"),
        "BAR.RED.POPC",
    ),
    (
        "clean_int_div_secret",
        |s| !has(s, "CALL") && has(s, "MUFU.RCP") && has(s, "IMAD.HI"),
        "inline division (MUFU.RCP, IMAD.HI), no call",
    ),
    (
        "clean_fast_div_rsqrt",
        |s| !has(s, "CALL") && has(s, "MUFU.RCP") && has(s, "MUFU.RSQ"),
        "MUFU.RCP + MUFU.RSQ, no call",
    ),
    ("clean_f2i_public_index", |s| has(s, "F2I"), "F2I"),
    (
        "clean_pred_store_public",
        |s| has(s, "STG") && any(s, |i| i.real_guard().is_some()),
        "a guarded store or exit",
    ),
    (
        "clean_minmax_arith",
        |s| has(s, "VIMNMX") || has(s, "IMNMX"),
        "IMNMX/VIMNMX",
    ),
    ("clean_noinline_arith", |s| calls(s, "callee_mix"), "CALL"),
    ("clean_prmt_data", |s| has(s, "PRMT"), "PRMT"),
    ("clean_elect_leader", |s| has(s, "ELECT"), "ELECT"),
];

fn check_leaks(file: &str, names: &[&str]) {
    let (audits, secs) = audit(file);
    assert_eq!(
        audits.len(),
        names.len(),
        "{file}: {:?}",
        audits.keys().collect::<Vec<_>>()
    );
    for name in names {
        let (_, rule, sink, witness, what) =
            LEAKS.iter().find(|c| c.0 == *name).expect("a corpus case");
        let a = audits
            .get(*name)
            .unwrap_or_else(|| panic!("kernel {name} missing"));
        let sec = &secs[*name];
        assert!(witness(sec), "{name}: the SASS lacks its witness ({what})");
        let hit = a.findings.iter().find(|f| {
            f.rule == *rule
                && f.text
                    .split_whitespace()
                    .find(|t| !t.starts_with('@'))
                    .is_some_and(|t| t.split('.').next() == Some(*sink))
        });
        let f = hit.unwrap_or_else(|| {
            panic!(
                "{name}: expected a rule-{} finding at a {sink}; got {:#?}",
                rule.number(),
                a.findings
            )
        });
        assert!(
            !f.chain.is_empty(),
            "{name}: finding without a taint chain: {f:#?}"
        );
    }
}

#[test]
fn cross_lane_leaks_are_flagged_and_present_in_sass() {
    let names: Vec<&str> = LEAKS[..15].iter().map(|c| c.0).collect();
    check_leaks("leaks_cross_lane.cu", &names);
}

#[test]
fn memory_latency_call_and_branch_leaks_are_flagged_and_present_in_sass() {
    let names: Vec<&str> = LEAKS[15..].iter().map(|c| c.0).collect();
    check_leaks("leaks_more.cu", &names);
}

#[test]
fn clean_but_tricky_kernels_have_no_finding() {
    let (audits, secs) = audit("clean_tricky.cu");
    assert_eq!(
        audits.len(),
        CLEAN.len(),
        "{:?}",
        audits.keys().collect::<Vec<_>>()
    );
    for (name, witness, what) in CLEAN {
        let a = audits
            .get(*name)
            .unwrap_or_else(|| panic!("kernel {name} missing"));
        assert!(
            witness(&secs[*name]),
            "{name}: the SASS lacks its witness ({what})"
        );
        assert!(a.findings.is_empty(), "{name}: {:#?}", a.findings);
    }
}

#[test]
fn issue_12_kernel_chain_runs_through_the_vote() {
    let (audits, _) = audit("leaks_cross_lane.cu");
    let a = &audits["leak_vote_any_branch"];
    let f = a
        .findings
        .iter()
        .find(|f| f.rule == Rule::ControlFlow)
        .expect("flagged");
    let ops: Vec<&str> = f.chain.iter().map(|s| base_op(&s.text)).collect();
    assert!(ops.iter().any(|o| o.starts_with("LDG")), "{ops:?}");
    assert!(ops.iter().any(|o| o.starts_with("VOTE")), "{ops:?}");
}

#[test]
fn shared_memory_across_warps_chain_goes_through_the_later_store() {
    let (audits, _) = audit("leaks_cross_lane.cu");
    let f = audits["leak_smem_cross_warp"]
        .findings
        .iter()
        .find(|f| f.rule == Rule::ControlFlow)
        .expect("flagged");
    let ops: Vec<&str> = f.chain.iter().map(|s| base_op(&s.text)).collect();
    let pos = |o: &str| ops.iter().position(|x| x.starts_with(o));
    assert!(
        pos("LDG") < pos("STS") && pos("STS") < pos("LDS") && pos("LDG").is_some(),
        "{ops:?}"
    );
}

#[test]
fn noinline_callee_branch_is_reported_in_the_callee() {
    let (audits, _) = audit("leaks_more.cu");
    let a = &audits["leak_noinline_arg_branch"];
    assert!(
        a.findings
            .iter()
            .any(|f| f.function != a.name && f.function.contains("callee_branches")),
        "{:#?}",
        a.findings
    );
}
