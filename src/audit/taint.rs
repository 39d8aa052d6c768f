//! Taint analysis to a fixed point over registers, uniform registers, predicates, uniform
//! predicates, shared memory (one cell: once any secret reaches shared memory, every shared load
//! is secret) and local memory (one cell, for spills).
//!
//! A location's state is `NONE` (public) or the index of the instruction whose write made it
//! secret; [`Analysis::causes`] records, for each tainting instruction, where its own secret
//! input came from, so a finding can print the chain back to the source.

use super::cfg::Cfg;
use super::sass::{Insn, Operand, Reg, RegOp, Section};

pub const NONE: u32 = u32::MAX;
const R_BASE: usize = 0; // R0..R254
const UR_BASE: usize = 255; // UR0..UR62
const P_BASE: usize = 255 + 63; // P0..P6
const UP_BASE: usize = P_BASE + 7; // UP0..UP6
pub const SMEM: usize = UP_BASE + 7;
pub const LMEM: usize = SMEM + 1;
pub const NLOC: usize = LMEM + 1;

/// "When guard predicate `guard` (negated if `neg`) holds, location `loc` has taint `val`":
/// what a write under a public guard leaves behind, so that later reads under the same guard
/// (the usual shape of predicated code: `@P5 VIADD R31, ..; @P5 SHF R86, .., R31`) see the
/// value written, not the weak join with the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cond {
    pub loc: usize,
    pub guard: usize,
    pub neg: bool,
    pub val: u32,
}

/// Taint of every location, plus the conditional facts of predicated writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub t: Vec<u32>,
    pub cond: Vec<Cond>,
}

impl State {
    pub fn public() -> State {
        State {
            t: vec![NONE; NLOC],
            cond: Vec::new(),
        }
    }
    /// Taints as seen by an instruction under `guard` (conditional facts applied).
    pub fn view(&self, guard: Option<(usize, bool)>) -> Vec<u32> {
        let mut v = self.t.clone();
        if let Some((g, neg)) = guard {
            for c in &self.cond {
                if c.guard == g && c.neg == neg {
                    v[c.loc] = c.val;
                }
            }
        }
        v
    }
}

impl std::ops::Index<usize> for State {
    type Output = u32;
    fn index(&self, l: usize) -> &u32 {
        &self.t[l]
    }
}
impl std::ops::IndexMut<usize> for State {
    fn index_mut(&mut self, l: usize) -> &mut u32 {
        &mut self.t[l]
    }
}

fn join1(a: u32, b: u32) -> u32 {
    if a != NONE {
        a
    } else {
        b
    }
}

/// Index of a tracked location; `None` for constants (RZ, PT).
pub fn loc(r: Reg) -> Option<usize> {
    match r {
        Reg::R(i) => Some(R_BASE + i as usize),
        Reg::UR(i) => Some(UR_BASE + i as usize),
        Reg::P(i) => Some(P_BASE + i as usize),
        Reg::UP(i) => Some(UP_BASE + i as usize),
        _ => None,
    }
}

pub fn loc_name(l: usize) -> String {
    match l {
        _ if l < UR_BASE => format!("R{}", l - R_BASE),
        _ if l < P_BASE => format!("UR{}", l - UR_BASE),
        _ if l < UP_BASE => format!("P{}", l - P_BASE),
        _ if l < SMEM => format!("UP{}", l - UP_BASE),
        SMEM => "shared memory".into(),
        _ => "local memory".into(),
    }
}

/// Locations of a register operand covering `width` consecutive registers (`PR` = all P).
pub fn locs(r: Reg, width: usize, out: &mut Vec<usize>) {
    match r {
        Reg::PR => out.extend((0..7).map(|i| P_BASE + i)),
        Reg::UPR => out.extend((0..7).map(|i| UP_BASE + i)),
        _ => {
            for k in 0..width.max(1) {
                if let Some(l) = r.offset(k).and_then(loc) {
                    out.push(l);
                }
            }
        }
    }
}

/// Opcodes that never write a register named in their first operand.
fn no_dest(insn: &Insn) -> bool {
    match insn.op() {
        "BRA" | "BRX" | "JMP" | "JMX" | "CALL" | "RET" | "EXIT" | "KILL" | "BSSY" | "BSYNC"
        | "BREAK" | "WARPSYNC" | "NANOSLEEP" | "YIELD" | "BPT" | "RTT" | "CCTL" | "MEMBAR"
        | "FENCE" | "ERRBAR" | "DEPBAR" | "NOP" => true,
        "BAR" => !insn.has_mod("RED"),
        _ => false,
    }
}

/// Memory instructions (their address operands and guards are rule-2 sinks).
pub fn is_memory(op: &str) -> bool {
    matches!(
        op,
        "LDG"
            | "STG"
            | "LD"
            | "ST"
            | "LDS"
            | "STS"
            | "LDL"
            | "STL"
            | "ATOM"
            | "ATOMG"
            | "ATOMS"
            | "RED"
            | "REDG"
            | "REDAS"
            | "LDSM"
            | "STSM"
            | "LDGSTS"
            | "UTMALDG"
            | "UTMASTG"
            | "UTMAPF"
            | "UTMAREDG"
            | "UTMACCTL"
            | "UBLKCP"
            | "UBLKRED"
            | "UBLKPF"
            | "LDC"
            | "ULDC"
            | "CCTL"
            | "SYNCS"
            | "SULD"
            | "SUST"
            | "SURED"
            | "SUATOM"
            | "TLD"
            | "TEX"
            | "TLD4"
            | "TMML"
            | "TXD"
            | "TXQ"
            | "HGMMA"
            | "IGMMA"
            | "QGMMA"
            | "BGMMA"
            | "LDTRAM"
            | "ATOMAS"
    )
}

/// Loads whose value comes from global (secret) memory.
fn loads_global(op: &str) -> bool {
    matches!(
        op,
        "LDG" | "LD" | "ATOM" | "ATOMG" | "SULD" | "SUATOM" | "TLD" | "TEX" | "TLD4" | "TXD"
    )
}

fn hgmma_shape_n(insn: &Insn) -> Option<usize> {
    insn.mods().find_map(|m| {
        let parts: Vec<&str> = m.split('x').collect();
        (parts.len() == 3 && parts.iter().all(|p| p.parse::<usize>().is_ok()))
            .then(|| parts[1].parse::<usize>().ok())
            .flatten()
    })
}

/// Registers per thread of the accumulator of a wgmma (HGMMA m64nNk16): N/2 (f32) or N/4 (f16).
pub fn gmma_acc_width(insn: &Insn) -> usize {
    let n = hgmma_shape_n(insn).unwrap_or(256);
    if insn.has_mod("F16") && !insn.has_mod("F32") {
        (n / 4).max(1)
    } else {
        (n / 2).max(1)
    }
}

fn is_gmma(op: &str) -> bool {
    matches!(op, "HGMMA" | "IGMMA" | "QGMMA" | "BGMMA")
}

/// Size in registers of the data moved by a memory instruction (`.64` → 2, `.128` → 4,
/// LDSM/STSM `.2`/`.4`).
pub fn mem_width(insn: &Insn) -> usize {
    let mut w = 1;
    for m in insn.mods() {
        match m {
            "64" => w = 2,
            "128" => w = 4,
            "2" | "4" if matches!(insn.op(), "LDSM" | "STSM") => w = m.parse().unwrap_or(1),
            _ => {}
        }
    }
    w
}

/// Registers covered by memory operand `k` of an instruction, expanded by width (address and
/// descriptor registers together).
pub fn mem_operand_locs(insn: &Insn, operand: &Operand) -> Vec<usize> {
    let mut v = Vec::new();
    if let Operand::Mem {
        prefix, desc, addr, ..
    } = operand
    {
        let op = insn.op();
        let tma_dims = insn
            .mods()
            .find_map(|m| m.strip_suffix('D').and_then(|d| d.parse::<usize>().ok()))
            .unwrap_or(5);
        for (j, r) in desc.iter().enumerate() {
            let w = if prefix == "gdesc" {
                // SS form (A and B descriptors, 4 UR) unless A comes from registers.
                let rs = insn.operands.get(1).and_then(|o| o.as_reg()).is_some();
                if rs {
                    2
                } else {
                    4
                }
            } else {
                2
            };
            let _ = j;
            locs(r.reg, r.width.max(w), &mut v);
        }
        for r in addr {
            let w = match op {
                // [URx]: shared address, mbarrier, then one coordinate per dimension.
                "UTMALDG" | "UTMASTG" | "UTMAPF" | "UTMAREDG" if r.reg.is_gpr() => 2 + tma_dims,
                "UBLKCP" | "UBLKRED" | "UBLKPF" => 2,
                _ => r.width,
            };
            locs(r.reg, w, &mut v);
        }
    }
    v
}

/// What one instruction reads and writes, independent of the taint state.
#[derive(Debug, Clone, Default)]
pub struct Effects {
    pub guard: Option<usize>,
    /// The guard is negated (`@!P0`).
    pub guard_neg: bool,
    pub dests: Vec<usize>,
    pub weak_dests: Vec<usize>,
    pub srcs: Vec<usize>,
    /// The value written is secret whatever the inputs (global load, wgmma accumulator,
    /// secret parameter).
    pub intrinsic: bool,
    pub reads_smem: bool,
    pub reads_lmem: bool,
    pub writes_smem: bool,
    pub writes_lmem: bool,
    /// The bytes written to shared memory are secret whatever the inputs (TMA, LDGSTS).
    pub smem_intrinsic: bool,
    /// Results are public whatever the inputs (mbarrier `SYNCS`).
    pub public_result: bool,
}

/// Parameter facts needed to decide whether a constant-bank read is secret.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    /// Constant-bank-0 byte ranges `[start, end)` of secret parameters.
    pub ranges: Vec<(u32, u32)>,
}

impl Secrets {
    pub fn cbank_secret(&self, bank: Option<u32>, offset: i64, bytes: u32, indexed: bool) -> bool {
        if self.ranges.is_empty() || !matches!(bank, Some(0) | None) {
            return false;
        }
        if indexed || bank.is_none() {
            return true;
        }
        let (s, e) = (offset as i128, offset as i128 + bytes as i128);
        self.ranges
            .iter()
            .any(|&(a, b)| s < b as i128 && (a as i128) < e)
    }
}

fn is_conversion(op: &str) -> bool {
    matches!(
        op,
        "F2I" | "I2F" | "F2F" | "I2I" | "F2IP" | "I2FP" | "FRND" | "UF2I" | "UI2F"
    )
}

/// Computes the static read/write sets of `insn`.
pub fn effects(insn: &Insn, secrets: &Secrets) -> Effects {
    let op = insn.op();
    let mut e = Effects {
        guard: insn.real_guard().and_then(|g| loc(g.reg)),
        guard_neg: insn.real_guard().map(|g| g.negated).unwrap_or(false),
        ..Default::default()
    };
    let ops = &insn.operands;
    // Number of leading destination operands.
    let ndest = if no_dest(insn) || ops.is_empty() {
        0
    } else {
        match &ops[0] {
            Operand::Reg(r0) => {
                if matches!(op, "FCHK" | "R2P" | "UR2UP") {
                    1
                } else if r0.reg.is_pred() {
                    match ops.get(1) {
                        Some(Operand::Reg(r1)) if !matches!(op, "P2R" | "UP2UR") => {
                            let _ = r1;
                            2
                        }
                        _ => 1,
                    }
                } else {
                    let maxp = if matches!(op, "IADD3" | "UIADD3") && !insn.has_mod("X") {
                        2
                    } else {
                        1
                    };
                    let mut n = 1;
                    while n < ops.len() && n <= maxp && !matches!(op, "P2R" | "UP2UR") {
                        match &ops[n] {
                            Operand::Reg(r) if r.reg.is_pred() && !r.negated => n += 1,
                            _ => break,
                        }
                    }
                    n
                }
            }
            _ => 0,
        }
    };
    let wide_all = insn.has_mod("64") && !is_memory(op) && !is_conversion(op)
        || op.starts_with('D')
            && matches!(op, "DADD" | "DMUL" | "DFMA" | "DMNMX" | "DSETP" | "DSET");
    let conv64 = is_conversion(op)
        && insn
            .mods()
            .any(|m| matches!(m, "F64" | "U64" | "S64" | "64"));
    let memw = mem_width(insn);
    let gmma = is_gmma(op);
    let accw = if gmma { gmma_acc_width(insn) } else { 0 };
    let wide_mul = matches!(op, "IMAD" | "UIMAD") && insn.has_mod("WIDE");

    // Destinations.
    for (k, o) in ops.iter().take(ndest).enumerate() {
        if let Operand::Reg(r) = o {
            let mut w = r.width;
            if k == 0 && !r.reg.is_pred() {
                if gmma {
                    w = accw;
                } else if wide_mul || wide_all || op == "CS2R" && !insn.has_mod("32") {
                    w = 2;
                } else if is_memory(op) || matches!(op, "LDL" | "LDS") {
                    w = w.max(memw);
                } else if matches!(op, "HMMA" | "IMMA" | "DMMA") {
                    let mut v = Vec::new();
                    locs(r.reg, 1, &mut v);
                    e.dests.extend(v);
                    locs(r.reg.offset(1).unwrap_or(Reg::Zero), 3, &mut e.weak_dests);
                    continue;
                } else if conv64 {
                    locs(r.reg, 1, &mut e.dests);
                    locs(r.reg.offset(1).unwrap_or(Reg::Zero), 1, &mut e.weak_dests);
                    continue;
                }
            }
            if r.reg == Reg::PR || r.reg == Reg::UPR {
                locs(r.reg, 1, &mut e.weak_dests);
            } else {
                locs(r.reg, w, &mut e.dests);
            }
        }
    }
    // Sources.
    let mut nsrc = 0;
    for o in ops.iter().skip(ndest) {
        match o {
            Operand::Reg(r) => {
                let mut w = r.width;
                if gmma {
                    let dest = ops.first().and_then(|d| d.as_reg()).map(|d| d.reg);
                    w = if Some(r.reg) == dest { accw } else { 4 };
                } else if wide_all || conv64 {
                    w = 2;
                } else if wide_mul && nsrc == 2 {
                    w = 2;
                } else if matches!(op, "HMMA" | "IMMA" | "DMMA") {
                    w = 4;
                } else if is_memory(op) && !r.reg.is_pred() {
                    w = w.max(memw);
                }
                locs(r.reg, w, &mut e.srcs);
                nsrc += 1;
            }
            Operand::Mem { .. } => {
                e.srcs.extend(mem_operand_locs(insn, o));
                nsrc += 1;
            }
            Operand::CBank {
                bank,
                offset,
                index,
            } => {
                let bytes = if matches!(op, "LDC" | "ULDC") {
                    4 * memw as u32
                } else if wide_all {
                    8
                } else {
                    4
                };
                if secrets.cbank_secret(*bank, *offset, bytes, !index.is_empty()) {
                    e.intrinsic = true;
                }
                for r in index {
                    locs(r.reg, r.width, &mut e.srcs);
                }
                nsrc += 1;
            }
            _ => nsrc += 1,
        }
    }
    // Memory classes.
    if loads_global(op) || gmma {
        e.intrinsic = true;
    }
    match op {
        "LDS" | "LDSM" | "ATOMS" => e.reads_smem = true,
        "LD" | "ATOM" => e.reads_smem = true,
        "LDL" => e.reads_lmem = true,
        _ => {}
    }
    match op {
        "STS" | "STSM" | "ATOMS" | "ST" | "ATOM" | "RED" => e.writes_smem = true,
        "LDGSTS" | "UTMALDG" | "UBLKCP" => {
            e.writes_smem = true;
            e.smem_intrinsic = true;
        }
        "STL" => e.writes_lmem = true,
        _ => {}
    }
    if op == "SYNCS" || op == "S2R" || op == "S2UR" || op == "CS2R" {
        e.public_result = true;
    }
    e
}

/// Where a secret value came from when an instruction made its destinations secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The instruction itself is a source (global load, wgmma, secret parameter).
    Source,
    /// The secret input was written by this instruction.
    From(u32),
}

/// Applies one instruction to `st`; returns why its results are secret, if they are.
pub fn transfer(i: usize, e: &Effects, st: &mut State) -> Option<Cause> {
    let g = e.guard.map(|l| st.t[l]).filter(|&v| v != NONE);
    // Reads see the conditional facts of this instruction's own guard.
    let s = st.view(e.guard.map(|l| (l, e.guard_neg)));
    let mut cause = None;
    if e.intrinsic && !e.public_result {
        cause = Some(Cause::Source);
    }
    let src_taint = e.srcs.iter().map(|&l| s[l]).find(|&v| v != NONE);
    if !e.public_result {
        if e.reads_smem && s[SMEM] != NONE {
            cause = Some(Cause::From(s[SMEM]));
        }
        if e.reads_lmem && s[LMEM] != NONE {
            cause = cause.or(Some(Cause::From(s[LMEM])));
        }
        if cause.is_none() {
            cause = src_taint.map(Cause::From);
        }
    }
    if let Some(g) = g {
        cause = cause.or(Some(Cause::From(g)));
    }
    let val = if cause.is_some() { i as u32 } else { NONE };
    match (e.guard, g) {
        (Some(gl), None) => {
            // Public guard: the write happens on some threads only.
            for &d in &e.dests {
                let other = st
                    .cond
                    .iter()
                    .find(|c| c.loc == d && c.guard == gl && c.neg != e.guard_neg)
                    .map(|c| c.val);
                st.t[d] = match other {
                    // Both polarities written: the value is fully determined.
                    Some(o) => join1(val, o),
                    None => join1(st.t[d], val),
                };
                // Facts under other guards may no longer hold; keep only the opposite polarity.
                st.cond
                    .retain(|c| c.loc != d || (c.guard == gl && c.neg != e.guard_neg));
                st.cond.push(Cond {
                    loc: d,
                    guard: gl,
                    neg: e.guard_neg,
                    val,
                });
            }
        }
        _ => {
            for &d in &e.dests {
                st.t[d] = val;
                st.cond.retain(|c| c.loc != d);
            }
        }
    }
    if val != NONE {
        for &d in &e.weak_dests {
            if st.t[d] == NONE {
                st.t[d] = val;
            }
            st.cond.retain(|c| c.loc != d);
        }
    }
    // A redefined predicate invalidates the facts it guarded.
    for &d in e.dests.iter().chain(e.weak_dests.iter()) {
        if d >= P_BASE && d < SMEM {
            st.cond.retain(|c| c.guard != d);
        }
    }
    if e.writes_smem
        && st.t[SMEM] == NONE
        && (e.smem_intrinsic || src_taint.is_some() || g.is_some())
    {
        st.t[SMEM] = i as u32;
    }
    if e.writes_lmem && st.t[LMEM] == NONE && (src_taint.is_some() || g.is_some()) {
        st.t[LMEM] = i as u32;
    }
    cause
}

/// Result of the fixed point.
pub struct Analysis {
    pub effects: Vec<Effects>,
    /// In-state of every reachable block (`None`: unreachable).
    pub block_in: Vec<Option<State>>,
    /// For each instruction that produced a secret (register or memory cell): why.
    pub causes: Vec<Option<Cause>>,
}

fn join_into(dst: &mut State, src: &State) -> bool {
    let mut changed = false;
    let old_t = dst.t.clone();
    for (d, &s) in dst.t.iter_mut().zip(src.t.iter()) {
        if *d == NONE && s != NONE {
            *d = s;
            changed = true;
        }
    }
    // Conditional facts: keep (loc, guard, neg) from either side, valued at the join of what
    // each side knows under that guard (its fact, or its plain taint); drop the ones no more
    // precise than the plain join.
    let mut keys: Vec<(usize, usize, bool)> = dst
        .cond
        .iter()
        .chain(src.cond.iter())
        .map(|c| (c.loc, c.guard, c.neg))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let val_in = |cs: &[Cond], t: &[u32], k: (usize, usize, bool)| {
        cs.iter()
            .find(|c| (c.loc, c.guard, c.neg) == k)
            .map(|c| c.val)
            .unwrap_or(t[k.0])
    };
    let mut cond = Vec::new();
    for k in keys {
        let v = join1(val_in(&dst.cond, &old_t, k), val_in(&src.cond, &src.t, k));
        if v == NONE && dst.t[k.0] != NONE {
            cond.push(Cond {
                loc: k.0,
                guard: k.1,
                neg: k.2,
                val: v,
            });
        }
    }
    if cond != dst.cond {
        dst.cond = cond;
        changed = true;
    }
    changed
}

/// Runs the analysis on a section to a fixed point.
pub fn analyze(sec: &Section, cfg: &Cfg, secrets: &Secrets) -> Analysis {
    let effects: Vec<Effects> = sec.insns.iter().map(|i| effects(i, secrets)).collect();
    let nb = cfg.blocks.len();
    let mut block_in: Vec<Option<State>> = vec![None; nb];
    let mut causes: Vec<Option<Cause>> = vec![None; sec.insns.len()];
    if nb == 0 {
        return Analysis {
            effects,
            block_in,
            causes,
        };
    }
    let entry = cfg.block_of[0];
    block_in[entry] = Some(State::public());
    let mut work: std::collections::VecDeque<usize> = [entry].into();
    let mut queued = vec![false; nb];
    queued[entry] = true;
    let mut visits = vec![0u32; nb];
    while let Some(b) = work.pop_front() {
        queued[b] = false;
        visits[b] += 1;
        if visits[b] > 200 {
            // Safety net for termination: fall back to plain (guard-insensitive) taint here.
            if let Some(st) = block_in[b].as_mut() {
                st.cond.clear();
            }
        }
        let mut s = block_in[b].clone().expect("queued blocks have a state");
        let blk = &cfg.blocks[b];
        for i in blk.start..blk.end {
            let before_smem = s[SMEM];
            let before_lmem = s[LMEM];
            let c = transfer(i, &effects[i], &mut s);
            if c.is_some() && causes[i].is_none() {
                causes[i] = c;
            }
            // Memory cells tainted by a store: remember the store's own secret input.
            if (before_smem == NONE && s[SMEM] == i as u32)
                || (before_lmem == NONE && s[LMEM] == i as u32)
            {
                if causes[i].is_none() {
                    let e = &effects[i];
                    causes[i] = if e.smem_intrinsic {
                        Some(Cause::Source)
                    } else {
                        e.srcs
                            .iter()
                            .map(|&l| s[l])
                            .find(|&v| v != NONE && v != i as u32)
                            .map(Cause::From)
                    };
                }
            }
        }
        for &succ in &blk.succs {
            let changed = match &mut block_in[succ] {
                Some(d) => join_into(d, &s),
                slot @ None => {
                    *slot = Some(s.clone());
                    true
                }
            };
            if changed && !queued[succ] {
                queued[succ] = true;
                work.push_back(succ);
            }
        }
    }
    Analysis {
        effects,
        block_in,
        causes,
    }
}

/// Registers read by `insn` (its sources, expanded), for rule checks that look at operands.
pub fn operand_locs(r: &RegOp) -> Vec<usize> {
    let mut v = Vec::new();
    locs(r.reg, r.width, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::super::{cfg, rules, sass};
    use super::*;

    fn findings(body: &str) -> Vec<rules::Finding> {
        let listing =
            format!("\t.section\t.text.k,\"ax\",@progbits\n        .type k,@function\nk:\n{body}");
        let secs = sass::parse_listing(&listing);
        let g = cfg::build(&secs[0]);
        let an = analyze(&secs[0], &g, &Secrets::default());
        rules::findings(&secs[0], &g, &an)
    }

    #[test]
    fn predicated_public_write_is_seen_under_the_same_guard() {
        // R31 is secret, then overwritten under public P5 and read under P5 only.
        let f = findings(
            "/*0000*/ LDG.E R31, desc[UR4][R2.64] ;\n\
             /*0010*/ S2R R0, SR_TID.X ;\n\
             /*0020*/ ISETP.GE.AND P5, PT, R0, 0x3, PT ;\n\
             /*0030*/ @P5 VIADD R31, R0, 0x1 ;\n\
             /*0040*/ @P5 LDS R4, [R31] ;\n\
             /*0050*/ EXIT ;\n",
        );
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn predicated_write_does_not_hide_the_other_side() {
        let f = findings(
            "/*0000*/ LDG.E R31, desc[UR4][R2.64] ;\n\
             /*0010*/ S2R R0, SR_TID.X ;\n\
             /*0020*/ ISETP.GE.AND P5, PT, R0, 0x3, PT ;\n\
             /*0030*/ @P5 VIADD R31, R0, 0x1 ;\n\
             /*0040*/ @!P5 LDS R4, [R31] ;\n\
             /*0050*/ LDS R5, [R31] ;\n\
             /*0060*/ EXIT ;\n",
        );
        let offs: Vec<u32> = f.iter().map(|x| x.offset).collect();
        assert_eq!(offs, vec![0x40, 0x50], "{f:#?}");
    }

    #[test]
    fn both_polarities_written_publicly_make_the_register_public() {
        let f = findings(
            "/*0000*/ LDG.E R31, desc[UR4][R2.64] ;\n\
             /*0010*/ S2R R0, SR_TID.X ;\n\
             /*0020*/ ISETP.GE.AND P5, PT, R0, 0x3, PT ;\n\
             /*0030*/ @P5 VIADD R31, R0, 0x1 ;\n\
             /*0040*/ @!P5 MOV R31, 0x4 ;\n\
             /*0050*/ LDS R5, [R31] ;\n\
             /*0060*/ EXIT ;\n",
        );
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn write_under_secret_guard_is_secret_and_pairs_are_tracked() {
        let f = findings(
            "/*0000*/ LDG.E R7, desc[UR4][R2.64] ;\n\
             /*0010*/ FSETP.GT.AND P0, PT, R7, RZ, PT ;\n\
             /*0020*/ MOV R9, 0x10 ;\n\
             /*0030*/ @P0 MOV R9, 0x20 ;\n\
             /*0040*/ IMAD.WIDE.U32 R4, R9, 0x4, R2 ;\n\
             /*0050*/ STG.E desc[UR4][R4.64+0x4], R0 ;\n\
             /*0060*/ LDG.E.64 R10, desc[UR4][R2.64] ;\n\
             /*0070*/ ISETP.NE.AND P1, PT, R11, RZ, PT ;\n\
             /*0080*/ @P1 BRA `(.L_x_1) ;\n\
             /*0090*/ NOP ;\n\
.L_x_1:\n\
             /*00a0*/ EXIT ;\n",
        );
        let got: Vec<(u32, u8)> = f.iter().map(|x| (x.offset, x.rule_number)).collect();
        assert_eq!(got, vec![(0x50, 2), (0x80, 1)], "{f:#?}");
        // The chain of the store runs from the load through the guarded move.
        let offs: Vec<u32> = f[0].chain.iter().map(|s| s.offset).collect();
        assert_eq!(offs, vec![0x0, 0x10, 0x30, 0x40]);
    }

    #[test]
    fn mbarrier_try_wait_loop_is_public() {
        let f = findings(
            "/*0000*/ LDG.E R0, desc[UR4][R2.64] ;\n\
.L_x_5:\n\
             /*0010*/ SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R0 ;\n\
             /*0020*/ @!P0 BRA `(.L_x_5) ;\n\
             /*0030*/ EXIT ;\n",
        );
        assert!(f.is_empty(), "{f:#?}");
    }
}
