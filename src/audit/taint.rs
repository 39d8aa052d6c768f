//! Taint analysis to a fixed point over registers, uniform registers, predicates, uniform
//! predicates, shared memory (one cell: once any secret reaches shared memory, every shared load
//! is secret) and local memory (one cell, for spills).
//!
//! A location's state is its *origin* — `NONE` (public) or the index of the instruction whose
//! write made it secret — and a 32-bit *taint mask*: which bits of the value may depend on a
//! secret. A secret value has every bit tainted ([`ALL`]); predicates and the memory cells only
//! ever hold `0` or `ALL`. [`Analysis::causes`] records, for each tainting instruction, where its
//! own secret input came from, so a finding can print the chain back to the source. The origin
//! is `NONE` exactly when the mask is `0`; any rule sink fires on any tainted bit.
//!
//! **Guards.** A write under a *public* guard leaves a conditional fact (see [`Cond`]); the
//! plain state is the bitwise join of written and not written. A write under a *secret* guard
//! taints, on top of that join, the bits that can differ between "written" and "not written":
//! for an in-place `LOP3` (destination also a source) exactly the bits the LUT can change given
//! the known operand bits (`OR imm`: the immediate's 1 bits; `AND imm`: its 0 bits); for `P2R
//! Rd, PR, Rd, mask` the inserted bits; for anything else every bit.
use super::bits::{bit_outputs, Out};
use super::cfg::Cfg;
pub use super::effects::{effects, is_memory, mem_operand_locs, Effects};
pub use super::loc::Secrets;
pub use super::loc::{
    loc, loc_name, locs, Cause, ALL, BARRES, LMEM, NLOC, NONE, P_BASE, R_BASE, SMEM, UP_BASE,
    UR_BASE,
};
use super::sass::{RegOp, Section};
use super::table::{self, Refusal};

/// "When guard predicate `guard` (negated if `neg`) holds, location `loc` has taint `val`
/// (origin) with bits `mask`": what a write under a public guard leaves behind, so that later
/// reads under the same guard (the usual shape of predicated code: `@P5 VIADD R31, ..; @P5 SHF
/// R86, .., R31`) see the value written, not the weak join with the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cond {
    pub loc: usize,
    pub guard: usize,
    pub neg: bool,
    pub val: u32,
    pub mask: u32,
}

/// Taint of every location (origin `t`, bit mask `m`), plus the conditional facts of
/// predicated writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub t: Vec<u32>,
    pub m: Vec<u32>,
    pub cond: Vec<Cond>,
}

impl State {
    pub fn public() -> State {
        State {
            t: vec![NONE; NLOC],
            m: vec![0; NLOC],
            cond: Vec::new(),
        }
    }
    /// Origins as seen by an instruction under `guard` (conditional facts applied).
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
    /// (origin, mask) of one location as seen under `guard`.
    pub fn get(&self, l: usize, guard: Option<(usize, bool)>) -> (u32, u32) {
        if let Some((g, neg)) = guard {
            if let Some(c) = self
                .cond
                .iter()
                .rev()
                .find(|c| c.loc == l && c.guard == g && c.neg == neg)
            {
                return (c.val, c.mask);
            }
        }
        (self.t[l], self.m[l])
    }
    /// Taint mask of one location (plain state).
    pub fn mask(&self, l: usize) -> u32 {
        self.m[l]
    }
}

impl std::ops::Index<usize> for State {
    type Output = u32;
    fn index(&self, l: usize) -> &u32 {
        &self.t[l]
    }
}

/// Join of two (origin, mask) taints.
fn join2(a: (u32, u32), b: (u32, u32)) -> (u32, u32) {
    let m = a.1 | b.1;
    if m == 0 {
        (NONE, 0)
    } else if a.1 != 0 {
        (a.0, m)
    } else {
        (b.0, m)
    }
}

/// Applies one instruction to `st`; returns why its results are secret, if they are.
pub fn transfer(i: usize, e: &Effects, st: &mut State, gl: &Globals) -> Option<Cause> {
    let g = e.guard.map(|l| st.t[l]).filter(|&v| v != NONE);
    // Reads see the conditional facts of this instruction's own guard, except cross-lane reads
    // (other lanes' facts under this guard are not this lane's).
    let gv = if e.cross_lane {
        None
    } else {
        e.guard.map(|l| (l, e.guard_neg))
    };
    let mut cause = None;
    let src_taint = e
        .srcs
        .iter()
        .map(|&l| st.get(l, gv).0)
        .find(|&v| v != NONE)
        .or_else(|| {
            // A shuffle's data may come from a lane anywhere in the program.
            e.shuffle_data
                .iter()
                .map(|&l| gl.ever[l])
                .find(|&v| v != NONE)
        });
    let mut weak_val = NONE;
    let outs: Vec<Out> = match &e.bitop {
        Some(b) => {
            let (o, c) = bit_outputs(i, b, &|l| st.get(l, gv));
            cause = c;
            o
        }
        _ => {
            if e.intrinsic {
                cause = Some(Cause::Source);
            }
            if e.reads_smem && st.t[SMEM] != NONE {
                cause = Some(Cause::From(st.t[SMEM]));
            }
            if e.reads_lmem && st.t[LMEM] != NONE {
                cause = cause.or(Some(Cause::From(st.t[LMEM])));
            }
            if e.reads_barrier_result && st.t[BARRES] != NONE {
                cause = cause.or(Some(Cause::From(st.t[BARRES])));
            }
            if cause.is_none() {
                cause = src_taint.map(Cause::From);
            }
            if cause.is_some() || g.is_some() {
                weak_val = i as u32;
            }
            let (val, mask) = if cause.is_some() {
                (i as u32, ALL)
            } else {
                (NONE, 0)
            };
            e.dests
                .iter()
                .map(|&d| Out {
                    loc: d,
                    origin: val,
                    mask,
                    diff: ALL,
                })
                .collect()
        }
    };
    if let Some(g) = g {
        cause = cause.or(Some(Cause::From(g)));
    }
    match (e.guard, g) {
        (Some(gl), None) => {
            // Public guard: the write happens on some threads only.
            for o in &outs {
                let d = o.loc;
                let new = (o.origin, o.mask);
                let other = st
                    .cond
                    .iter()
                    .find(|c| c.loc == d && c.guard == gl && c.neg != e.guard_neg)
                    .map(|c| (c.val, c.mask));
                let (t, m) = match other {
                    // Both polarities written: the value is fully determined.
                    Some(ot) => join2(new, ot),
                    None => join2((st.t[d], st.m[d]), new),
                };
                st.t[d] = t;
                st.m[d] = m;
                // Facts under other guards may no longer hold; keep only the opposite polarity.
                st.cond
                    .retain(|c| c.loc != d || (c.guard == gl && c.neg != e.guard_neg));
                st.cond.push(Cond {
                    loc: d,
                    guard: gl,
                    neg: e.guard_neg,
                    val: new.0,
                    mask: new.1,
                });
            }
        }
        (_, Some(_)) => {
            // Secret guard: written or not is secret; the bits that can differ are tainted.
            for o in &outs {
                let d = o.loc;
                let (t, m) = join2((st.t[d], st.m[d]), (o.origin, o.mask));
                let (t, m) = if o.diff & !m != 0 {
                    (i as u32, m | o.diff)
                } else {
                    (t, m)
                };
                st.t[d] = t;
                st.m[d] = m;
                st.cond.retain(|c| c.loc != d);
            }
        }
        (None, None) => {
            for o in &outs {
                st.t[o.loc] = o.origin;
                st.m[o.loc] = o.mask;
                st.cond.retain(|c| c.loc != o.loc);
            }
        }
    }
    if weak_val != NONE {
        for &d in &e.weak_dests {
            if st.t[d] == NONE {
                st.t[d] = weak_val;
            }
            st.m[d] = ALL;
            st.cond.retain(|c| c.loc != d);
        }
    }
    // A redefined predicate invalidates the facts it guarded.
    let redefined = outs.iter().map(|o| o.loc).chain(if e.bitop.is_none() {
        e.weak_dests.clone()
    } else {
        Vec::new()
    });
    for d in redefined {
        if (P_BASE..SMEM).contains(&d) {
            st.cond.retain(|c| c.guard != d);
        }
    }
    if e.writes_smem
        && st.t[SMEM] == NONE
        && (e.smem_intrinsic || src_taint.is_some() || g.is_some())
    {
        st.t[SMEM] = i as u32;
        st.m[SMEM] = ALL;
    }
    if e.external_call {
        // Unknown code may leave secrets in local and shared memory.
        for c in [LMEM, SMEM] {
            if st.t[c] == NONE {
                st.t[c] = i as u32;
                st.m[c] = ALL;
            }
        }
    }
    if e.writes_lmem && st.t[LMEM] == NONE && (src_taint.is_some() || g.is_some()) {
        st.t[LMEM] = i as u32;
        st.m[LMEM] = ALL;
    }
    if e.writes_barrier_result && st.t[BARRES] == NONE && (src_taint.is_some() || g.is_some()) {
        st.t[BARRES] = i as u32;
        st.m[BARRES] = ALL;
    }
    cause
}

/// Flow-insensitive facts about what other threads can hand this one: a location's origin if it
/// is secret at *any* reachable point. Shared memory and the barrier-result cell are written by
/// other warps at other program points (a warp may read, early in its code, what another warp
/// stores later in its own); a shuffle may read a lane that is elsewhere. These are seeded into
/// every state (memory cells) or read directly (shuffle data), and the analysis is repeated until
/// they no longer grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Globals {
    pub ever: Vec<u32>,
}

impl Default for Globals {
    fn default() -> Self {
        Globals {
            ever: vec![NONE; NLOC],
        }
    }
}

/// Result of the fixed point.
pub struct Analysis {
    pub effects: Vec<Effects>,
    /// In-state of every reachable block (`None`: unreachable).
    pub block_in: Vec<Option<State>>,
    /// For each instruction that produced a secret (register or memory cell): why.
    pub causes: Vec<Option<Cause>>,
    /// The cross-thread facts the final round ran with.
    pub globals: Globals,
}

/// An instruction the rule table refuses: its index and why.
#[derive(Debug, Clone)]
pub struct Refused {
    pub index: usize,
    pub why: Refusal,
}

fn join_into(dst: &mut State, src: &State) -> bool {
    let mut changed = false;
    let old_t = dst.t.clone();
    let old_m = dst.m.clone();
    for l in 0..NLOC {
        let (t, m) = join2((dst.t[l], dst.m[l]), (src.t[l], src.m[l]));
        if m != dst.m[l] || t != dst.t[l] {
            dst.t[l] = t;
            dst.m[l] = m;
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
    let val_in = |cs: &[Cond], t: &[u32], m: &[u32], k: (usize, usize, bool)| {
        cs.iter()
            .find(|c| (c.loc, c.guard, c.neg) == k)
            .map(|c| (c.val, c.mask))
            .unwrap_or((t[k.0], m[k.0]))
    };
    let mut cond = Vec::new();
    for k in keys {
        let v = join2(
            val_in(&dst.cond, &old_t, &old_m, k),
            val_in(&src.cond, &src.t, &src.m, k),
        );
        if v.1 != dst.m[k.0] {
            cond.push(Cond {
                loc: k.0,
                guard: k.1,
                neg: k.2,
                val: v.0,
                mask: v.1,
            });
        }
    }
    if cond != dst.cond {
        dst.cond = cond;
        changed = true;
    }
    changed
}

/// Read/write sets of every instruction of a section, from the rule table; the first
/// instruction the table does not know is refused.
pub fn section_effects(sec: &Section, secrets: &Secrets) -> Result<Vec<Effects>, Refused> {
    sec.insns
        .iter()
        .enumerate()
        .map(|(i, insn)| {
            let (rule, roles) = table::classify(insn).map_err(|why| Refused { index: i, why })?;
            let mut e = effects(insn, rule.class, &roles, secrets);
            if secrets.public_reads.binary_search(&i).is_ok() {
                super::effects::public_read(&mut e);
            }
            let in_section = super::cfg::direct_callee(insn)
                .is_some_and(|t| sec.functions.iter().any(|(n, _)| n == t));
            if insn.op() == "CALL" && !in_section {
                super::effects::external_call(&mut e);
            }
            Ok(e)
        })
        .collect()
}

/// Runs the analysis on a section to a fixed point (repeated while the cross-thread facts grow).
pub fn analyze(sec: &Section, cfg: &Cfg, secrets: &Secrets) -> Result<Analysis, Refused> {
    let effects = section_effects(sec, secrets)?;
    let mut causes: Vec<Option<Cause>> = vec![None; sec.insns.len()];
    let mut track: Vec<usize> = vec![SMEM, BARRES];
    for e in &effects {
        track.extend_from_slice(&e.shuffle_data);
    }
    track.sort_unstable();
    track.dedup();
    let mut gl = Globals::default();
    loop {
        let (block_in, ever) = fixed_point(&effects, cfg, &gl, &track, &mut causes);
        if ever == gl.ever {
            return Ok(Analysis {
                effects,
                block_in,
                causes,
                globals: gl,
            });
        }
        for (g, e) in gl.ever.iter_mut().zip(ever) {
            if *g == NONE {
                *g = e;
            }
        }
    }
}

fn fixed_point(
    effects: &[Effects],
    cfg: &Cfg,
    gl: &Globals,
    track: &[usize],
    causes: &mut [Option<Cause>],
) -> (Vec<Option<State>>, Vec<u32>) {
    let nb = cfg.blocks.len();
    let mut block_in: Vec<Option<State>> = vec![None; nb];
    let mut ever = gl.ever.clone();
    if nb == 0 {
        return (block_in, ever);
    }
    let entry = cfg.block_of[0];
    let mut init = State::public();
    for l in [SMEM, BARRES] {
        if gl.ever[l] != NONE {
            init.t[l] = gl.ever[l];
            init.m[l] = ALL;
        }
    }
    block_in[entry] = Some(init);
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
            let before = [s[SMEM], s[LMEM], s[BARRES]];
            let c = transfer(i, &effects[i], &mut s, gl);
            if c.is_some() && causes[i].is_none() {
                causes[i] = c;
            }
            // Memory cells tainted by a store: remember the store's own secret input.
            let newly = [SMEM, LMEM, BARRES]
                .iter()
                .zip(before)
                .any(|(&l, b)| b == NONE && s[l] == i as u32);
            if newly && causes[i].is_none() {
                let e = &effects[i];
                causes[i] = if e.smem_intrinsic {
                    Some(Cause::Source)
                } else {
                    e.srcs
                        .iter()
                        .map(|&l| s[l])
                        .find(|&v| v != NONE && v != i as u32)
                        .map(Cause::From)
                        .or(e
                            .guard
                            .map(|g| s[g])
                            .filter(|&v| v != NONE)
                            .map(Cause::From))
                };
            }
            for &l in track {
                if ever[l] == NONE && s[l] != NONE {
                    ever[l] = s[l];
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
    (block_in, ever)
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
        let an = analyze(&secs[0], &g, &Secrets::default()).expect("known opcodes");
        rules::findings(&secs[0], &g, &an)
    }

    /// Runs straight-line `body` from a public state and returns the final state.
    fn state_after(body: &str) -> State {
        let listing =
            format!("\t.section\t.text.k,\"ax\",@progbits\n        .type k,@function\nk:\n{body}");
        let secs = sass::parse_listing(&listing);
        let mut st = State::public();
        let effects = section_effects(&secs[0], &Secrets::default()).expect("known opcodes");
        for (i, e) in effects.iter().enumerate() {
            transfer(i, e, &mut st, &Globals::default());
        }
        st
    }

    fn r(i: usize) -> usize {
        R_BASE + i
    }
    fn p(i: usize) -> usize {
        P_BASE + i
    }

    /// R7 secret (global load), P4 secret (compare of it), P1 public (lane == 0), R0/R3 public
    /// with unknown bits.
    const PRELUDE: &str = "/*0000*/ LDG.E R7, desc[UR4][R2.64] ;\n\
         /*0010*/ FSETP.GT.AND P4, PT, R7, RZ, PT ;\n\
         /*0020*/ S2R R0, SR_LANEID ;\n\
         /*0030*/ ISETP.EQ.AND P1, PT, R0, RZ, PT ;\n\
         /*0040*/ S2R R3, SR_TID.X ;\n";

    /// The packing ptxas emits under register pressure: a secret predicate into bit 30, a
    /// public one into bit 28, then one bit extracted into a predicate that guards an mbarrier
    /// arrive.
    fn packed(extract: &str) -> String {
        format!(
            "{PRELUDE}\
             /*0100*/ IMAD.MOV.U32 R9, RZ, RZ, RZ ;\n\
             /*0110*/ @P4 LOP3.LUT R9, R9, 0x40000000, RZ, 0xfc, !PT ;\n\
             /*0120*/ LOP3.LUT R9, R9, 0x7fffffff, RZ, 0xc0, !PT ;\n\
             /*0130*/ LOP3.LUT R9, R9, 0xf7ffffff, RZ, 0xc0, !PT ;\n\
             /*0140*/ LOP3.LUT R9, R9, 0xefffffff, RZ, 0xc0, !PT ;\n\
             /*0150*/ @P1 LOP3.LUT R9, R9, 0x10000000, RZ, 0xfc, !PT ;\n\
             /*0160*/ LOP3.LUT P0, RZ, R9, {extract}, RZ, 0xc0, !PT ;\n\
             /*0170*/ @!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R11+URZ], RZ ;\n\
             /*0180*/ EXIT ;\n"
        )
    }

    #[test]
    fn packed_predicate_extracting_a_public_bit_is_public() {
        let st = state_after(&packed("0x10000000"));
        assert_eq!(
            st.mask(r(9)),
            0x4000_0000,
            "only the secret predicate's bit"
        );
        assert_eq!(st.mask(p(0)), 0, "bit 28 came from lane == 0");
        let f = findings(&packed("0x10000000"));
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn packed_predicate_extracting_the_secret_bit_is_secret() {
        let st = state_after(&packed("0x40000000"));
        assert_eq!(st.mask(p(0)), ALL);
        let f = findings(&packed("0x40000000"));
        let got: Vec<(u32, u8)> = f.iter().map(|x| (x.offset, x.rule_number)).collect();
        assert_eq!(got, vec![(0x170, 2)], "{f:#?}");
        // The chain runs from the load through the compare and the guarded OR to the extract.
        let offs: Vec<u32> = f[0].chain.iter().map(|s| s.offset).collect();
        assert_eq!(offs.first(), Some(&0x0), "{offs:x?}");
        assert!(offs.contains(&0x10) && offs.contains(&0x110), "{offs:x?}");
        assert_eq!(offs.last(), Some(&0x160), "{offs:x?}");
        // Extracting both bits is secret too.
        assert!(!findings(&packed("0x50000000")).is_empty());
    }

    #[test]
    fn and_with_zero_bits_and_or_with_one_bits_make_bits_public() {
        let st = state_after(&format!(
            "{PRELUDE}\
             /*0100*/ LOP3.LUT R10, R7, 0x0, RZ, 0xc0, !PT ;\n\
             /*0110*/ LOP3.LUT R11, R7, 0xffff0000, RZ, 0xc0, !PT ;\n\
             /*0120*/ LOP3.LUT R12, R7, 0xffffffff, RZ, 0xfc, !PT ;\n\
             /*0130*/ LOP3.LUT R13, R7, 0xff, RZ, 0xfc, !PT ;\n\
             /*0140*/ LOP3.LUT R14, R11, 0xfffeffff, RZ, 0xc0, !PT ;\n"
        ));
        assert_eq!(st.mask(r(10)), 0, "x & 0 is 0");
        assert_eq!(st.mask(r(11)), 0xffff_0000);
        assert_eq!(st.mask(r(12)), 0, "x | ~0 is ~0");
        assert_eq!(st.mask(r(13)), 0xffff_ff00);
        assert_eq!(
            st.mask(r(14)),
            0xfffe_0000,
            "clearing bit 16 makes it public"
        );
        // A public address computed as secret & 0 is no leak; secret & 0xff is.
        let body = |imm: &str| {
            format!(
                "{PRELUDE}\
                 /*0100*/ LOP3.LUT R10, R7, {imm}, RZ, 0xc0, !PT ;\n\
                 /*0110*/ LDS R4, [R10] ;\n\
                 /*0120*/ EXIT ;\n"
            )
        };
        assert!(findings(&body("0x0")).is_empty());
        assert_eq!(findings(&body("0xff")).len(), 1);
    }

    #[test]
    fn lut_decides_which_operands_matter_and_public_registers_are_unknown() {
        let st = state_after(&format!(
            "{PRELUDE}\
             /*0100*/ LOP3.LUT R10, R0, R7, RZ, 0xf0, !PT ;\n\
             /*0110*/ LOP3.LUT R11, R0, R7, R3, 0xcc, !PT ;\n\
             /*0120*/ LOP3.LUT R12, R7, R0, RZ, 0xc0, !PT ;\n\
             /*0130*/ LOP3.LUT R13, R7, R0, RZ, 0x3c, !PT ;\n\
             /*0140*/ LOP3.LUT R14, R0, R3, RZ, 0xc0, !PT ;\n\
             /*0150*/ LOP3.LUT R15, R12, 0xf, R0, 0xea, !PT ;\n"
        ));
        assert_eq!(st.mask(r(10)), 0, "LUT 0xf0 reads only a");
        assert_eq!(st.mask(r(11)), ALL, "LUT 0xcc reads only b");
        assert_eq!(st.mask(r(12)), ALL, "AND with an unknown public register");
        assert_eq!(st.mask(r(13)), ALL, "XOR");
        assert_eq!(st.mask(r(14)), 0, "public inputs");
        // (a & b) | c with b = 0xf: bits 4.. of a are masked off.
        assert_eq!(st.mask(r(15)), 0xf);
    }

    #[test]
    fn secret_guard_on_in_place_or_taints_only_the_written_bits() {
        let st = state_after(&format!(
            "{PRELUDE}\
             /*0100*/ MOV R9, R3 ;\n\
             /*0110*/ @P4 LOP3.LUT R9, R9, 0x40000000, RZ, 0xfc, !PT ;\n\
             /*0120*/ MOV R10, R3 ;\n\
             /*0130*/ @P4 LOP3.LUT R10, R10, 0xfffffffe, RZ, 0xc0, !PT ;\n\
             /*0140*/ MOV R11, R3 ;\n\
             /*0150*/ @P4 LOP3.LUT R11, R0, 0x1, RZ, 0xc0, !PT ;\n\
             /*0160*/ MOV R12, R3 ;\n\
             /*0170*/ @P4 MOV R12, 0x1 ;\n"
        ));
        assert_eq!(st.mask(r(9)), 0x4000_0000, "OR imm: the immediate's 1 bits");
        assert_eq!(st.mask(r(10)), 0x1, "AND imm: the immediate's 0 bits");
        assert_eq!(st.mask(r(11)), ALL, "not in place: any bit may differ");
        assert_eq!(st.mask(r(12)), ALL);
        // Under a public guard the bits stay public.
        let st = state_after(&format!(
            "{PRELUDE}\
             /*0100*/ MOV R9, R3 ;\n\
             /*0110*/ @P1 LOP3.LUT R9, R9, 0x40000000, RZ, 0xfc, !PT ;\n"
        ));
        assert_eq!(st.mask(r(9)), 0);
    }

    #[test]
    fn immediate_shifts_move_the_mask_and_additions_carry_it_up() {
        let st = state_after(&format!(
            "{PRELUDE}\
             /*0100*/ LOP3.LUT R6, R7, 0xff, RZ, 0xc0, !PT ;\n\
             /*0110*/ SHF.L.U32 R10, R6, 0x4, RZ ;\n\
             /*0120*/ SHF.R.U32.HI R11, RZ, 0x4, R6 ;\n\
             /*0130*/ LOP3.LUT R5, R7, 0x80000000, RZ, 0xc0, !PT ;\n\
             /*0140*/ SHF.R.S32.HI R12, RZ, 0x4, R5 ;\n\
             /*0150*/ SHF.R.U32.HI R13, RZ, 0x4, R5 ;\n\
             /*0160*/ IMAD.SHL.U32 R14, R6, 0x10, RZ ;\n\
             /*0170*/ LEA R15, R6, RZ, 0x2 ;\n\
             /*0180*/ LEA R16, R6, R0, 0x4 ;\n\
             /*0190*/ SHF.L.U64.HI R17, R5, 0x1, R6 ;\n\
             /*01a0*/ USHF.L.U32 UR5, UR4, 0x3, URZ ;\n\
             /*01b0*/ IADD3 R18, R6, 0x1, RZ ;\n\
             /*01c0*/ LEA R19, P2, R0, R3, 0x2 ;\n\
             /*01d0*/ LEA R20, P3, R6, R3, 0x2 ;\n"
        ));
        assert_eq!(st.mask(r(10)), 0xff0);
        assert_eq!(st.mask(r(11)), 0xf);
        assert_eq!(
            st.mask(r(12)),
            0xf800_0000,
            "arithmetic shift replicates the sign"
        );
        assert_eq!(st.mask(r(13)), 0x0800_0000);
        assert_eq!(st.mask(r(14)), 0xff0);
        assert_eq!(st.mask(r(15)), 0x3fc);
        assert_eq!(st.mask(r(16)), 0xffff_fff0, "carries move taint upward");
        assert_eq!(st.mask(r(17)), 0x1fe | 0x1, "high word of {{R6:R5}} << 1");
        assert_eq!(st.mask(UR_BASE + 5), 0);
        assert_eq!(st.mask(r(18)), ALL, "other arithmetic stays conservative");
        assert_eq!((st.mask(r(19)), st.mask(p(2))), (0, 0));
        assert_eq!((st.mask(r(20)), st.mask(p(3))), (0xffff_fc00 | 0x3fc, ALL));
    }

    #[test]
    fn p2r_and_r2p_map_predicates_to_bits() {
        let st = state_after(&format!(
            "{PRELUDE}\
             /*0100*/ P2R R10, PR, RZ, 0x2 ;\n\
             /*0110*/ P2R R11, PR, RZ, 0x12 ;\n\
             /*0120*/ P2R.B1 R12, PR, R10, 0x10 ;\n\
             /*0130*/ P2R R13, PR, R7, 0x2 ;\n\
             /*0140*/ R2P PR, R11, 0x12 ;\n\
             /*0150*/ MOV R14, R11 ;\n\
             /*0160*/ IMAD.MOV.U32 R15, RZ, RZ, R11 ;\n\
             /*0170*/ R2UR UR6, R11 ;\n"
        ));
        assert_eq!(st.mask(r(10)), 0, "P1 only");
        assert_eq!(st.mask(r(11)), 0x10, "P4 into bit 4");
        assert_eq!(st.mask(r(12)), 0x1000, ".B1: P4 into bit 12");
        assert_eq!(st.mask(r(13)), !0x2, "other bits from the secret base");
        assert_eq!(st.mask(p(1)), 0, "bit 1 is public");
        assert_eq!(st.mask(p(4)), ALL, "bit 4 is secret");
        assert_eq!(st.mask(r(14)), 0x10, "MOV copies the mask");
        assert_eq!(st.mask(r(15)), 0x10);
        assert_eq!(st.mask(UR_BASE + 6), 0x10);
        // R2P of the public bit then a guarded load: clean; of the secret bit: a leak.
        let body = |pred: &str| {
            format!(
                "{PRELUDE}\
                 /*0100*/ P2R R11, PR, RZ, 0x12 ;\n\
                 /*0110*/ R2P PR, R11, 0x12 ;\n\
                 /*0120*/ @{pred} LDS R4, [R3] ;\n\
                 /*0130*/ EXIT ;\n"
            )
        };
        assert!(findings(&body("P1")).is_empty());
        assert_eq!(findings(&body("P4")).len(), 1);
    }

    #[test]
    fn selects_of_constants_and_additions_carry_taint_upward_only() {
        // The shape NVRTC emits for `flags = (x > 0) << 30 | (lane == 0) << 28`, read back with
        // a byte-selected R2P.
        let body = |pred: &str| {
            format!(
                "{PRELUDE}\
                 /*0100*/ SEL R9, RZ, 0x40000000, !P4 ;\n\
                 /*0110*/ @!P1 VIADD R9, R9, 0x10000000 ;\n\
                 /*0120*/ R2P PR, R9.B3, 0x50 ;\n\
                 /*0130*/ @{pred} LDS R4, [R3] ;\n\
                 /*0140*/ EXIT ;\n"
            )
        };
        let st = state_after(&body("P4"));
        assert_eq!(st.mask(r(9)), 0xc000_0000, "bit 30, and carries above it");
        assert_eq!(st.mask(p(4)), 0, "bit 28 (byte 3, bit 4) is public");
        assert_eq!(st.mask(p(6)), ALL, "bit 30 (byte 3, bit 6) is secret");
        assert!(findings(&body("P4")).is_empty());
        assert_eq!(findings(&body("P6")).len(), 1);
        let st = state_after(&format!(
            "{PRELUDE}\
             /*0100*/ SEL R10, R0, R3, P4 ;\n\
             /*0110*/ SEL R11, 0x5, 0x5, P4 ;\n\
             /*0120*/ LOP3.LUT R6, R7, 0xf00, RZ, 0xc0, !PT ;\n\
             /*0130*/ IADD3 R12, R6, R0, -R3 ;\n\
             /*0140*/ IADD3 R13, P2, R0, R3, RZ ;\n\
             /*0150*/ IADD3.X R14, R6, R0, RZ, P2, !PT ;\n"
        ));
        assert_eq!(st.mask(r(10)), ALL, "unknown sides under a secret selector");
        assert_eq!(st.mask(r(11)), 0, "equal constants");
        assert_eq!(st.mask(r(12)), 0xffff_ff00);
        assert_eq!((st.mask(r(13)), st.mask(p(2))), (0, 0));
        assert_eq!(st.mask(r(14)), ALL, "carry-in: conservative");
    }

    #[test]
    fn masks_join_bitwise_across_branches() {
        // One path leaves R9 with secret bit 30, the other with secret bit 0: after the join both
        // are secret, bit 28 is not.
        let body = |imm: &str| {
            format!(
                "{PRELUDE}\
                 /*0100*/ IMAD.MOV.U32 R9, RZ, RZ, RZ ;\n\
                 /*0110*/ ISETP.NE.AND P2, PT, R3, RZ, PT ;\n\
                 /*0120*/ @P2 BRA `(.L_x_1) ;\n\
                 /*0130*/ @P4 LOP3.LUT R9, R9, 0x40000000, RZ, 0xfc, !PT ;\n\
                 /*0140*/ BRA `(.L_x_2) ;\n\
.L_x_1:\n\
                 /*0150*/ @P4 LOP3.LUT R9, R9, 0x1, RZ, 0xfc, !PT ;\n\
.L_x_2:\n\
                 /*0160*/ LOP3.LUT P0, RZ, R9, {imm}, RZ, 0xc0, !PT ;\n\
                 /*0170*/ @P0 BRA `(.L_x_3) ;\n\
                 /*0180*/ NOP ;\n\
.L_x_3:\n\
                 /*0190*/ EXIT ;\n"
            )
        };
        assert!(findings(&body("0x10000000")).is_empty());
        assert_eq!(findings(&body("0x40000000")).len(), 1);
        assert_eq!(findings(&body("0x1")).len(), 1);
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
    fn mbarrier_try_wait_loop_is_public_unless_the_phase_is_secret() {
        // The barrier's state depends on arrivals and byte counts (public): waiting on a public
        // phase is clean even while the tile it guards is secret.
        let body = |phase: &str| {
            format!(
                "/*0000*/ LDG.E R0, desc[UR4][R2.64] ;\n\
                 /*0010*/ S2R R5, SR_TID.X ;\n\
                 /*0020*/ LOP3.LUT R6, R5, 0x1, RZ, 0xc0, !PT ;\n\
.L_x_5:\n\
                 /*0030*/ SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], {phase} ;\n\
                 /*0040*/ @!P0 BRA `(.L_x_5) ;\n\
                 /*0050*/ EXIT ;\n"
            )
        };
        let f = findings(&body("R6"));
        assert!(f.is_empty(), "{f:#?}");
        // Waiting for a secret phase parity: how long the thread waits depends on the secret.
        // Flagged at the wait (its phase operand) and at the retry branch.
        let f = findings(&body("R0"));
        let offs: Vec<u32> = f.iter().map(|x| x.offset).collect();
        assert_eq!(offs, vec![0x30, 0x40], "{f:#?}");
    }

    #[test]
    fn issue_12_vote_result_is_secret() {
        // FSETP on a secret → VOTE.ANY → ISETP folding the vote → branch (a pattern compilers emit).
        let f = findings(
            "/*0000*/ LDG.E R2, desc[UR4][R2.64] ;\n\
             /*0010*/ FSETP.GT.AND P0, PT, R2, 100, PT ;\n\
             /*0020*/ VOTE.ANY P0, P0 ;\n\
             /*0030*/ ISETP.LT.OR P0, PT, R7, 0x1, !P0 ;\n\
             /*0040*/ @P0 BRA `(.L_x_1) ;\n\
             /*0050*/ NOP ;\n\
.L_x_1:\n\
             /*0060*/ EXIT ;\n",
        );
        let offs: Vec<u32> = f.iter().map(|x| x.offset).collect();
        assert_eq!(offs, vec![0x40], "{f:#?}");
        let chain: Vec<u32> = f[0].chain.iter().map(|s| s.offset).collect();
        assert_eq!(chain, vec![0x0, 0x10, 0x20, 0x30]);
    }

    #[test]
    fn collectives_carry_taint_from_any_source_operand() {
        for (insn, dest) in [
            ("VOTE.ANY R9, PT, P4", r(9)),
            ("VOTEU.ALL UP1, P4", UP_BASE + 1),
            ("MATCH.ANY R9, R7", r(9)),
            ("REDUX.SUM UR9, R7", UR_BASE + 9),
            ("SHFL.IDX PT, R9, R0, R7, 0x1f", r(9)),
            ("SHFL.BFLY PT, R9, R7, 0x1, 0x1f", r(9)),
            ("ELECT P2, URZ, P4", p(2)),
        ] {
            let st = state_after(&format!("{PRELUDE}/*0100*/ {insn} ;\n"));
            assert_eq!(st.mask(dest), ALL, "{insn}");
            // The same instruction with public inputs is public.
            let public = insn.replace("P4", "P1").replace("R7", "R3");
            let st = state_after(&format!("{PRELUDE}/*0100*/ {public} ;\n"));
            assert_eq!(st.mask(dest), 0, "{public}");
        }
    }

    #[test]
    fn shuffle_reads_other_lanes_registers_flow_insensitively() {
        // R8 is public here but secret in code other lanes may be running (the other side of a
        // branch): a shuffle of R8 may hand over the secret.
        let f = findings(
            "/*0000*/ S2R R0, SR_TID.X ;\n\
             /*0010*/ ISETP.GE.AND P0, PT, R0, 0x10, PT ;\n\
             /*0020*/ @P0 BRA `(.L_x_1) ;\n\
             /*0030*/ MOV R8, R0 ;\n\
             /*0040*/ SHFL.IDX PT, R9, R8, 0x10, 0x1f ;\n\
             /*0050*/ LDS R4, [R9] ;\n\
             /*0060*/ EXIT ;\n\
.L_x_1:\n\
             /*0070*/ LDG.E R8, desc[UR4][R2.64] ;\n\
             /*0080*/ EXIT ;\n",
        );
        let offs: Vec<u32> = f.iter().map(|x| x.offset).collect();
        assert_eq!(offs, vec![0x50], "{f:#?}");
    }

    #[test]
    fn shared_memory_written_later_by_another_warp_is_secret_earlier() {
        // Warp 0 loads before (in layout) the code where other warps store a secret.
        let f = findings(
            "/*0000*/ S2R R0, SR_TID.X ;\n\
             /*0010*/ ISETP.GE.AND P0, PT, R0, 0x20, PT ;\n\
             /*0020*/ @P0 BRA `(.L_x_1) ;\n\
             /*0030*/ LDS R4, [R0] ;\n\
             /*0040*/ ISETP.NE.AND P1, PT, R4, RZ, PT ;\n\
             /*0050*/ @P1 EXIT ;\n\
             /*0060*/ EXIT ;\n\
.L_x_1:\n\
             /*0070*/ LDG.E R8, desc[UR4][R2.64] ;\n\
             /*0080*/ STS [R0], R8 ;\n\
             /*0090*/ EXIT ;\n",
        );
        let offs: Vec<u32> = f.iter().map(|x| x.offset).collect();
        assert_eq!(offs, vec![0x50], "{f:#?}");
        let chain: Vec<u32> = f[0].chain.iter().map(|s| s.offset).collect();
        assert_eq!(
            chain,
            vec![0x70, 0x80, 0x30, 0x40],
            "load → store → shared load → compare"
        );
    }

    #[test]
    fn barrier_reduction_result_is_secret_when_any_thread_votes_a_secret() {
        let body = |pred: &str| {
            format!(
                "{PRELUDE}\
                 /*0100*/ BAR.RED.POPC.DEFER_BLOCKING 0x0, {pred} ;\n\
                 /*0110*/ B2R.RESULT R9 ;\n\
                 /*0120*/ LDS R4, [R9] ;\n\
                 /*0130*/ EXIT ;\n"
            )
        };
        assert!(findings(&body("P1")).is_empty());
        let f = findings(&body("P4"));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].offset, 0x120);
    }

    #[test]
    fn code_after_an_external_call_is_analysed_and_sees_its_results_secret() {
        // `malloc`/`vprintf` are called through a register to code outside the section; the
        // code after the call must still be reached, and what the callee leaves is secret.
        let f = findings(
            "/*0000*/ S2R R2, SR_TID.X ;\n\
             /*0010*/ LDC.64 R6, c[0x4][R0] ;\n\
             /*0020*/ LEPC R20, `(.L_x_1) ;\n\
             /*0030*/ CALL.ABS.NOINC R6 ;\n\
.L_x_1:\n\
             /*0040*/ LDS R8, [R2] ;\n\
             /*0050*/ EXIT ;\n",
        );
        let offs: Vec<u32> = f.iter().map(|x| x.offset).collect();
        assert_eq!(offs, vec![0x40], "{f:#?}");
        // With a secret argument the call itself is a finding (its running time is unseen).
        let f = findings(
            "/*0000*/ LDG.E R4, desc[UR4][R2.64] ;\n\
             /*0010*/ LDC.64 R6, c[0x4][R0] ;\n\
             /*0020*/ CALL.ABS.NOINC R6 ;\n\
             /*0030*/ EXIT ;\n",
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].offset, f[0].rule_number), (0x20, 3));
    }

    #[test]
    fn unlabelled_targets_and_qualified_branches_keep_the_code_after_them_reachable() {
        let leak_after = |branch: &str| {
            findings(&format!(
                "/*0000*/ LDG.E R4, desc[UR4][R2.64] ;\n\
                 /*0010*/ {branch} ;\n\
                 /*0020*/ LDS R8, [R4] ;\n\
                 /*0030*/ EXIT ;\n\
.L_x_1:\n\
                 /*0040*/ EXIT ;\n"
            ))
        };
        // A target the listing does not label: it may be anywhere in the function.
        let f = leak_after("BRA `(.L_x_nowhere)");
        assert_eq!(
            f.iter().map(|x| x.offset).collect::<Vec<_>>(),
            vec![0x20],
            "{f:#?}"
        );
        // BRA.DIV branches only when the warp is diverged: it may fall through.
        let f = leak_after("BRA.DIV UR4, `(.L_x_1)");
        assert_eq!(
            f.iter().map(|x| x.offset).collect::<Vec<_>>(),
            vec![0x20],
            "{f:#?}"
        );
        // A plain unconditional branch really skips it.
        assert!(leak_after("BRA `(.L_x_1)").is_empty());
    }
}
