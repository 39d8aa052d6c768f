//! The sinks: docs/design.md §1's three rules, checked on every reachable instruction against the
//! taint state before it.
//!
//! * Rule 1 (control flow): `BRA`/`EXIT`/`RET`/`KILL`/`BREAK`/`BSSY`/`BSYNC`/`CALL` under a
//!   secret guard or with a secret predicate operand; `BRX`/`JMX`/`JMP`/`RET`/`CALL` through a
//!   secret register; `WARPSYNC` with a secret mask or guard; `BAR` with a secret barrier id or
//!   thread count or under a secret guard; warp-collective ops (`VOTE`, `SHFL`, `MATCH`, `REDUX`,
//!   `ELECT`) under a secret guard (their member mask is then secret); an mbarrier arrive with a
//!   secret transaction count.
//! * Rule 2 (memory): any memory instruction (global, shared, local, constant with register
//!   index, atomics, LDSM/STSM, LDGSTS, TMA/bulk copies with their coordinates, mbarrier ops,
//!   wgmma shared-memory descriptors) with a secret address register or a secret guard.
//! * Rule 3 (variable latency): `FCHK` on a secret operand; a `CALL` to a compiler slow-path
//!   routine (`$__internal_*` IEEE div/sqrt/rcp slow paths, `__cuda_sm20_{div,rem}_{s,u}64`) that
//!   receives a secret or is reached under a secret guard; the secret branch that dispatches to
//!   such a call (the fast/slow split); `MUFU.RSQ`/`MUFU.SQRT`/`MUFU.RCP` (and the 64-bit
//!   `RSQ64H`/`RCP64H`) of a secret whose result the slow path later fixes up (a slow-path call
//!   before the region's `BSYNC`); `NANOSLEEP` of a secret.
//!
//! Instructions inside a slow-path routine itself are not reported one by one: the call site
//! carries the rule-3 finding.

use super::cfg::Cfg;
use super::sass::{Insn, Operand, Section};
use super::srcloc::SrcLoc;
use super::table::Class;
use super::taint::{self, Analysis, Cause, State, NONE};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, PartialOrd, Ord)]
pub enum Rule {
    /// §1 rule 1: branch, exit, indirect jump, barrier count or warp-sync mask from a secret.
    #[serde(rename = "control-flow")]
    ControlFlow,
    /// §1 rule 2: memory address or memory-instruction guard from a secret.
    #[serde(rename = "memory-address")]
    MemoryAddress,
    /// §1 rule 3: variable-latency sequence on a secret.
    #[serde(rename = "variable-latency")]
    VariableLatency,
}

impl Rule {
    pub fn number(&self) -> u8 {
        match self {
            Rule::ControlFlow => 1,
            Rule::MemoryAddress => 2,
            Rule::VariableLatency => 3,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            Rule::ControlFlow => "control-flow",
            Rule::MemoryAddress => "memory-address",
            Rule::VariableLatency => "variable-latency",
        }
    }
}

/// One instruction of a taint chain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Step {
    pub offset: u32,
    pub text: String,
    /// The source line, where the cubin has line info (`-lineinfo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<SrcLoc>,
}

/// A violation of one of the rules.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    pub kernel: String,
    /// The function (kernel or subroutine) holding the instruction.
    pub function: String,
    pub offset: u32,
    pub text: String,
    pub rule: Rule,
    /// 1, 2 or 3.
    pub rule_number: u8,
    pub reason: String,
    /// The source line of the instruction, where the cubin has line info (`-lineinfo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<SrcLoc>,
    /// From the source of the secret to the instruction before the sink.
    pub chain: Vec<Step>,
}

/// Whether a called routine is a compiler slow path with data-dependent latency.
pub fn is_slow_path(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let internal = n.contains("__internal") || n.contains("__cuda_sm");
    internal
        && (n.contains("div")
            || n.contains("rem")
            || n.contains("sqrt")
            || n.contains("rcp")
            || n.contains("slowpath"))
}

/// Whether instruction `i` is a CALL to a slow-path routine.
fn slow_call(sec: &Section, i: usize) -> bool {
    let insn = &sec.insns[i];
    insn.op() == "CALL" && insn.label_target().map(is_slow_path).unwrap_or(false)
}

struct Ctx<'a> {
    sec: &'a Section,
    cfg: &'a Cfg,
    an: &'a Analysis,
    /// Per function: does some instruction in it read a secret (context-insensitive).
    func_touches_secret: Vec<bool>,
    /// Per function: registers read before written (in layout order).
    func_live_in: Vec<Vec<usize>>,
}

fn live_in(sec: &Section, an: &Analysis, f: usize) -> Vec<usize> {
    let mut written = vec![false; taint::NLOC];
    let mut out = Vec::new();
    for i in sec.function_range(f) {
        let e = &an.effects[i];
        for &s in &e.srcs {
            if !written[s] && !out.contains(&s) {
                out.push(s);
            }
        }
        if e.guard.is_none() {
            for &d in &e.dests {
                written[d] = true;
            }
        }
    }
    out
}

/// Is `i`'s conditional branch the fast/slow dispatch of a variable-latency sequence?
fn dispatches_slow_path(cx: &Ctx, i: usize, pred_origin: Option<u32>) -> bool {
    if let Some(o) = pred_origin {
        if cx.sec.insns.get(o as usize).map(|x| x.op()) == Some("FCHK") {
            return true;
        }
    }
    let n = cx.sec.insns.len();
    let mut starts = vec![i + 1];
    if let Some(t) = cx.sec.insns[i]
        .label_target()
        .and_then(|l| cx.sec.labels.get(l).copied())
    {
        starts.push(t);
    }
    starts
        .into_iter()
        .any(|s| (s..(s + 6).min(n)).any(|j| slow_call(cx.sec, j)))
}

fn tainted(s: &[u32], ls: &[usize]) -> Option<(usize, u32)> {
    ls.iter().map(|&l| (l, s[l])).find(|&(_, v)| v != NONE)
}

fn reg_locs(op: &Operand) -> Vec<usize> {
    match op {
        Operand::Reg(r) => taint::operand_locs(r),
        _ => vec![],
    }
}

/// Checks instruction `i` against the rules with state `s` (before it). Returns
/// (rule, reason, origin of the secret that reached the sink).
fn check(cx: &Ctx, i: usize, st: &State) -> Vec<(Rule, String, Option<u32>)> {
    let insn: &Insn = &cx.sec.insns[i];
    let op = insn.op();
    let e = &cx.an.effects[i];
    // Operands as seen under this instruction's own guard.
    let view = st.view(e.guard.map(|l| (l, e.guard_neg)));
    let s: &[u32] = &view;
    let mut out = Vec::new();
    let guard = e.guard.map(|l| (l, s[l])).filter(|&(_, v)| v != NONE);
    let guard_desc = |l: usize| format!("guard predicate {} is secret", taint::loc_name(l));
    // Predicate and register operands (all non-memory operands).
    let pred_ops: Vec<usize> = insn
        .operands
        .iter()
        .filter(|o| o.as_reg().map(|r| r.reg.is_pred()).unwrap_or(false))
        .flat_map(reg_locs)
        .collect();
    let gpr_ops: Vec<usize> = insn
        .operands
        .iter()
        .filter(|o| o.as_reg().map(|r| r.reg.is_gpr()).unwrap_or(false))
        .flat_map(reg_locs)
        .collect();

    let class = e.class.unwrap_or(Class::Sync);
    match class {
        Class::Control => {
            let mut hit: Option<(String, u32)> = None;
            if let Some((l, v)) = guard {
                hit = Some((guard_desc(l), v));
            } else if let Some((l, v)) = tainted(s, &pred_ops) {
                hit = Some((
                    format!("branch predicate {} is secret", taint::loc_name(l)),
                    v,
                ));
            } else {
                // Jump/call targets, return addresses, warp-sync masks, divergence masks.
                if let Some((l, v)) = tainted(s, &gpr_ops) {
                    let what = match op {
                        "WARPSYNC" => "warp-sync mask",
                        "BRA" => "branch operand",
                        _ => "jump target",
                    };
                    hit = Some((
                        format!("{what} register {} is secret", taint::loc_name(l)),
                        v,
                    ));
                }
            }
            if let Some((why, v)) = hit {
                let rule = if (op == "CALL" && slow_call(cx.sec, i))
                    || (op == "BRA" && dispatches_slow_path(cx, i, Some(v)))
                {
                    Rule::VariableLatency
                } else {
                    Rule::ControlFlow
                };
                let what = match (op, rule) {
                    ("BRA", Rule::VariableLatency) => {
                        "secret-dependent dispatch to a variable-latency slow path"
                    }
                    ("CALL", Rule::VariableLatency) => "slow-path call under a secret guard",
                    ("EXIT" | "KILL", _) => "exit depends on a secret",
                    ("BRX" | "BRXU" | "JMX" | "JMXU" | "JMP", _) => {
                        "indirect jump depends on a secret"
                    }
                    ("RET", _) => "return address depends on a secret",
                    ("CALL", _) => "call target depends on a secret",
                    ("WARPSYNC", _) => "warp-sync mask depends on a secret",
                    _ => "branch depends on a secret",
                };
                out.push((rule, format!("{what}: {why}"), Some(v)));
            }
            if e.external_call && out.is_empty() {
                let callee = insn.label_target().unwrap_or("a register target");
                let args = tainted(s, &e.srcs)
                    .map(|(l, v)| (taint::loc_name(l), v))
                    .or_else(|| {
                        (s[taint::LMEM] != NONE)
                            .then(|| ("local memory".to_string(), s[taint::LMEM]))
                    });
                if let Some((what, v)) = args {
                    out.push((
                        Rule::VariableLatency,
                        format!(
                            "call to code outside this kernel ({callee}) with secret {what}: its \
                             running time is not audited"
                        ),
                        Some(v),
                    ));
                }
            }
            if op == "CALL" && slow_call(cx.sec, i) && out.is_empty() {
                let callee = insn
                    .label_target()
                    .and_then(|t| cx.sec.functions.iter().position(|(n, _)| n == t));
                if let Some(f) = callee {
                    if let Some((l, v)) = tainted(s, &cx.func_live_in[f]) {
                        out.push((
                            Rule::VariableLatency,
                            format!(
                                "call to variable-latency routine {} with secret input {}",
                                cx.sec.functions[f].0,
                                taint::loc_name(l)
                            ),
                            Some(v),
                        ));
                    } else if cx.func_touches_secret[f] {
                        out.push((
                            Rule::VariableLatency,
                            format!(
                                "variable-latency routine {} computes on a secret",
                                cx.sec.functions[f].0
                            ),
                            None,
                        ));
                    }
                }
            }
        }
        Class::Barrier => {
            if let Some((l, v)) = guard {
                out.push((
                    Rule::ControlFlow,
                    format!("barrier under a secret guard: {}", guard_desc(l)),
                    Some(v),
                ));
            } else if let Some((l, v)) = tainted(s, &gpr_ops) {
                out.push((
                    Rule::ControlFlow,
                    format!("barrier id/count register {} is secret", taint::loc_name(l)),
                    Some(v),
                ));
            }
        }
        Class::Collective | Class::Shuffle => {
            if op == "ELECT" {
                if let Some((l, v)) = tainted(s, &gpr_ops) {
                    out.push((
                        Rule::ControlFlow,
                        format!("ELECT member mask {} is secret", taint::loc_name(l)),
                        Some(v),
                    ));
                }
            }
            if let Some((l, v)) = guard {
                out.push((
                    Rule::ControlFlow,
                    format!(
                        "warp-collective {op} under a secret guard (member mask): {}",
                        guard_desc(l)
                    ),
                    Some(v),
                ));
            }
        }
        Class::Sync if op != "NOP" => {
            // Synchronisation, register reallocation, warpgroup arrive/wait, fences: whether
            // they run (and so how long the thread waits) must not depend on a secret.
            if let Some((l, v)) = guard {
                out.push((
                    Rule::ControlFlow,
                    format!("{op} under a secret guard: {}", guard_desc(l)),
                    Some(v),
                ));
            }
        }
        _ if op == "FCHK" => {
            if let Some((l, v)) = tainted(s, &e.srcs) {
                out.push((
                    Rule::VariableLatency,
                    format!(
                        "FCHK (IEEE division range check) of secret {}",
                        taint::loc_name(l)
                    ),
                    Some(v),
                ));
            }
        }
        _ if op == "MUFU" => {
            let f = insn.mods().next().unwrap_or("");
            if matches!(f, "RSQ" | "SQRT" | "RCP" | "RSQ64H" | "RCP64H") {
                if let Some((l, v)) = tainted(s, &e.srcs) {
                    // Is the result fixed up by a slow path before the region reconverges?
                    let end = cx.sec.function_range(cx.sec.function_of(i)).end;
                    let mut fixed = false;
                    for j in i + 1..end.min(i + 48) {
                        let o = cx.sec.insns[j].op();
                        if slow_call(cx.sec, j) {
                            fixed = true;
                            break;
                        }
                        if matches!(o, "BSYNC" | "EXIT" | "RET") {
                            break;
                        }
                    }
                    if fixed {
                        out.push((
                            Rule::VariableLatency,
                            format!(
                                "MUFU.{f} of secret {} feeds an IEEE slow-path fix-up",
                                taint::loc_name(l)
                            ),
                            Some(v),
                        ));
                    }
                }
            }
        }
        Class::Sleep => {
            if let Some((l, v)) = tainted(s, &gpr_ops).or(guard) {
                out.push((
                    Rule::VariableLatency,
                    format!("NANOSLEEP duration/guard {} is secret", taint::loc_name(l)),
                    Some(v),
                ));
            }
        }
        _ => {}
    }
    if class == Class::Mbarrier {
        // Arrive counts, transaction byte counts, init counts, phase parities: each decides
        // when a waiting thread goes on.
        if let Some((l, v)) = tainted(s, &gpr_ops) {
            out.push((
                Rule::ControlFlow,
                format!(
                    "mbarrier count/phase operand {} is secret",
                    taint::loc_name(l)
                ),
                Some(v),
            ));
        }
    }
    // Rule 2: memory instructions.
    let mut mem_hit: Option<(String, u32)> = None;
    if class == Class::Texture {
        if let Some((l, v)) = tainted(s, &gpr_ops) {
            mem_hit = Some((
                format!(
                    "texture/surface coordinate {} is secret",
                    taint::loc_name(l)
                ),
                v,
            ));
        }
    }
    if taint::is_memory(op) {
        if let Some((l, v)) = guard {
            mem_hit = Some((
                format!("memory access under a secret guard: {}", guard_desc(l)),
                v,
            ));
        }
        if mem_hit.is_none() {
            for o in &insn.operands {
                let ls = taint::mem_operand_locs(insn, o);
                if let Some((l, v)) = tainted(s, &ls) {
                    mem_hit = Some((
                        format!("address register {} is secret", taint::loc_name(l)),
                        v,
                    ));
                    break;
                }
            }
        }
        // Bulk and tensor copies, prefetches: their register operands outside the brackets are
        // sizes, coordinates and multicast masks, each shaping the traffic.
        if mem_hit.is_none()
            && matches!(
                class,
                Class::AsyncToShared | Class::AsyncFromShared | Class::Prefetch
            )
        {
            if let Some((l, v)) = tainted(s, &gpr_ops) {
                mem_hit = Some((
                    format!(
                        "copy size/coordinate register {} is secret",
                        taint::loc_name(l)
                    ),
                    v,
                ));
            }
        }
    }
    if mem_hit.is_none() {
        for o in &insn.operands {
            if let Operand::CBank { index, .. } = o {
                let ls: Vec<usize> = index.iter().flat_map(taint::operand_locs).collect();
                if let Some((l, v)) = tainted(s, &ls) {
                    mem_hit = Some((
                        format!("constant-bank index {} is secret", taint::loc_name(l)),
                        v,
                    ));
                }
            }
        }
    }
    if let Some((why, v)) = mem_hit {
        out.push((Rule::MemoryAddress, format!("{op}: {why}"), Some(v)));
    }
    out
}

/// Walks the causes back from `origin` to the source; returns source-first steps.
fn chain(sec: &Section, an: &Analysis, origin: Option<u32>) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut cur = origin;
    while let Some(o) = cur {
        if !seen.insert(o) || steps.len() > 64 {
            break;
        }
        let insn = &sec.insns[o as usize];
        steps.push(Step {
            offset: insn.offset,
            text: insn.text.clone(),
            source: sec.source_of(o as usize).cloned(),
        });
        cur = match an.causes[o as usize] {
            Some(Cause::From(p)) => Some(p),
            _ => None,
        };
    }
    steps.reverse();
    steps
}

/// All findings of one kernel section.
pub fn findings(sec: &Section, cfg: &Cfg, an: &Analysis) -> Vec<Finding> {
    let nf = sec.functions.len();
    let mut touches = vec![false; nf];
    let mut states_before: Vec<Option<State>> = vec![None; sec.insns.len()];
    for (b, blk) in cfg.blocks.iter().enumerate() {
        let Some(mut s) = an.block_in[b].clone() else {
            continue;
        };
        for i in blk.start..blk.end {
            states_before[i] = Some(s.clone());
            let e = &an.effects[i];
            if e.intrinsic
                || e.srcs.iter().any(|&l| s[l] != NONE)
                || (e.reads_smem && s[taint::SMEM] != NONE)
            {
                touches[sec.function_of(i)] = true;
            }
            taint::transfer(i, e, &mut s, &an.globals);
        }
    }
    let cx = Ctx {
        sec,
        cfg,
        an,
        func_touches_secret: touches,
        func_live_in: (0..nf).map(|f| live_in(sec, an, f)).collect(),
    };
    let _ = cx.cfg;
    let mut out: Vec<Finding> = Vec::new();
    for (i, st) in states_before.iter().enumerate() {
        let Some(s) = st else { continue };
        let f = sec.function_of(i);
        if f != 0 && is_slow_path(&sec.functions[f].0) {
            continue;
        }
        for (rule, reason, origin) in check(&cx, i, s) {
            if out
                .iter()
                .any(|x| x.offset == sec.insns[i].offset && x.rule == rule)
            {
                continue;
            }
            out.push(Finding {
                kernel: sec.kernel.clone(),
                function: sec.functions[f].0.clone(),
                offset: sec.insns[i].offset,
                text: sec.insns[i].text.clone(),
                rule,
                rule_number: rule.number(),
                reason,
                source: sec.source_of(i).cloned(),
                chain: chain(sec, an, origin),
            });
        }
    }
    out
}

/// Whether instruction `i` reads a secret — a register operand (address or data), its guard, or
/// shared memory holding secrets — in the taint state before it; false when it is unreachable.
/// Decides whether a write of a public buffer stores only public values at a public address.
pub fn secret_operands(cfg: &Cfg, an: &Analysis, i: usize) -> bool {
    let b = cfg.block_of[i];
    let Some(mut s) = an.block_in[b].clone() else {
        return false;
    };
    for j in cfg.blocks[b].start..i {
        taint::transfer(j, &an.effects[j], &mut s, &an.globals);
    }
    let e = &an.effects[i];
    let view = s.view(e.guard.map(|l| (l, e.guard_neg)));
    e.guard.is_some_and(|l| view[l] != NONE)
        || e.srcs.iter().any(|&l| view[l] != NONE)
        || (e.reads_smem && view[taint::SMEM] != NONE)
}
