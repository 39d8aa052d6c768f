//! Warp roles: parts of a kernel that no two lanes of one warp can both run.
//!
//! A warp-specialised kernel splits its warps by thread index at the top (`if (threadIdx.x <
//! 128) producer(); else consumer();`): in SASS a plain guarded `BRA` on a predicate set, in the
//! branch's own block, by `ISETP.<cmp>.AND P, PT, R, imm, PT` where `R` holds exactly
//! `SR_TID.X` on every path and the threshold cuts between warps (`GE`/`LT` with `imm` a
//! multiple of 32, `GT`/`LE` with `imm + 1` one). The predicate is then the same for the 32
//! lanes of a warp and never changes for a thread, so every lane of a warp takes the same side
//! of that branch every time it gets there.
//!
//! For such a split, the blocks a lane can reach only through its taken edge (not reachable from
//! the entry once that edge is removed) and those it can reach only through its fall-through
//! edge are run by disjoint sets of warps. Cross-lane reads (`SHFL`, votes) read lanes of the
//! reader's own warp: what a register holds in the other side's blocks never reaches them
//! ([`Roles::compatible`], used by the provenance analysis for what another lane's register may
//! hold). Everything else stays as it was: a kernel without such a split has one role, and any
//! doubt (another form of predicate, a register that may not be the thread index on some path,
//! a block reachable both ways, calls and returns shared by both sides) keeps blocks compatible.

use super::cfg::Cfg;
use super::effects::Effects;
use super::loc::loc;
use super::sass::{Operand, Reg, Section};

/// Per block: on which side of each warp split it lies (`None`: both, or before the split).
#[derive(Debug, Clone, Default)]
pub struct Roles {
    /// `side[b][k]`: block b's side of split k.
    side: Vec<Vec<Option<bool>>>,
}

impl Roles {
    /// Whether lanes of one warp may run blocks `a` and `b` (false only when a warp split puts
    /// them on opposite sides).
    pub fn compatible(&self, a: usize, b: usize) -> bool {
        let (Some(sa), Some(sb)) = (self.side.get(a), self.side.get(b)) else {
            return true;
        };
        !sa.iter()
            .zip(sb)
            .any(|(x, y)| matches!((x, y), (Some(p), Some(q)) if p != q))
    }

    /// The number of warp splits found.
    pub fn splits(&self) -> usize {
        self.side.first().map_or(0, |s| s.len())
    }

    /// Block `b`'s sides, one per split (for grouping blocks into classes).
    pub fn sides(&self, b: usize) -> &[Option<bool>] {
        self.side.get(b).map_or(&[], |s| s.as_slice())
    }
}

/// The thread-index register of `insn` if it is `S2R Rd, SR_TID.X`.
fn reads_tid_x(insn: &super::sass::Insn) -> Option<usize> {
    if insn.op() != "S2R" || insn.real_guard().is_some() {
        return None;
    }
    match insn.operands.as_slice() {
        [Operand::Reg(d), Operand::Other(s)] if s == "SR_TID.X" && d.width <= 1 => loc(d.reg),
        _ => None,
    }
}

/// Registers holding exactly `SR_TID.X` at each block's entry, on every path (a must-analysis:
/// intersection at joins; any write kills).
fn tid_regs(sec: &Section, cfg: &Cfg, effects: &[Effects]) -> Vec<Option<Vec<usize>>> {
    let nb = cfg.blocks.len();
    let mut block_in: Vec<Option<Vec<usize>>> = vec![None; nb];
    if nb == 0 {
        return block_in;
    }
    let entry = cfg.block_of[0];
    block_in[entry] = Some(Vec::new());
    let mut work = vec![entry];
    while let Some(b) = work.pop() {
        let mut s = block_in[b].clone().expect("queued blocks have a state");
        let blk = &cfg.blocks[b];
        for (insn, e) in sec.insns[blk.start..blk.end]
            .iter()
            .zip(&effects[blk.start..blk.end])
        {
            s.retain(|l| !e.dests.contains(l) && !e.weak_dests.contains(l));
            if let Some(l) = reads_tid_x(insn) {
                s.push(l);
            }
        }
        for &succ in &blk.succs {
            let new = match &block_in[succ] {
                None => s.clone(),
                Some(old) => old.iter().copied().filter(|l| s.contains(l)).collect(),
            };
            if block_in[succ].as_ref() != Some(&new) {
                block_in[succ] = Some(new);
                work.push(succ);
            }
        }
    }
    block_in
}

/// Whether `ISETP` comparison `cmp` against `imm` gives the same answer for every thread index
/// of one warp (indices 32·w .. 32·w + 31).
fn cuts_between_warps(cmp: &str, imm: i64) -> bool {
    match cmp {
        "GE" | "LT" => imm >= 0 && imm % 32 == 0,
        "GT" | "LE" => imm >= -1 && (imm + 1) % 32 == 0,
        _ => false,
    }
}

fn imm_value(o: &Operand) -> Option<i64> {
    let Operand::Imm(s) = o else { return None };
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// If block `b` ends in a warp split: (taken block, fall-through block).
fn split_of(
    sec: &Section,
    cfg: &Cfg,
    effects: &[Effects],
    tid_in: &[Option<Vec<usize>>],
    b: usize,
) -> Option<(usize, usize)> {
    let blk = &cfg.blocks[b];
    let last = blk.end.checked_sub(1).filter(|&l| l >= blk.start)?;
    let bra = &sec.insns[last];
    let plain = bra.op() == "BRA"
        && bra.mods().all(|m| m == "U")
        && bra.operands.len() == 1
        && matches!(bra.operands[0], Operand::Label(_));
    let guard = bra.real_guard()?;
    if !plain || !matches!(guard.reg, Reg::P(_)) {
        return None;
    }
    let taken = cfg.block_of[*sec.labels.get(bra.label_target()?)?];
    let fall = *cfg.block_of.get(blk.end)?;
    if taken == fall || !blk.succs.contains(&taken) || !blk.succs.contains(&fall) {
        return None;
    }
    let g = loc(guard.reg)?;
    // The guard's last writer in this block: `ISETP.<cmp>[.U32].AND g, PT, R, imm, PT`.
    let def = (blk.start..last)
        .rev()
        .find(|&i| effects[i].dests.contains(&g) || effects[i].weak_dests.contains(&g))?;
    let isetp = &sec.insns[def];
    let mods: Vec<&str> = isetp.mods().collect();
    let cmp = *mods.first()?;
    let mods_ok = mods[1..].iter().all(|m| matches!(*m, "U32" | "AND"))
        && mods.contains(&"AND")
        && isetp.real_guard().is_none();
    let (src, imm) = match isetp.operands.as_slice() {
        [Operand::Reg(p), Operand::Reg(pt), Operand::Reg(r), imm, Operand::Reg(c)]
            if loc(p.reg) == Some(g)
                && !p.negated
                && pt.reg == Reg::True
                && c.reg == Reg::True
                && !c.negated
                && !r.negated
                && r.width <= 1 =>
        {
            (loc(r.reg)?, imm_value(imm)?)
        }
        _ => return None,
    };
    if isetp.op() != "ISETP" || !mods_ok || !cuts_between_warps(cmp, imm) {
        return None;
    }
    // `src` holds the thread index at the ISETP: at the block's entry, and not written since.
    let mut held = tid_in[b].clone()?;
    for (insn, e) in sec.insns[blk.start..def]
        .iter()
        .zip(&effects[blk.start..def])
    {
        held.retain(|l| !e.dests.contains(l) && !e.weak_dests.contains(l));
        if let Some(l) = reads_tid_x(insn) {
            held.push(l);
        }
    }
    held.contains(&src).then_some((taken, fall))
}

/// Blocks reachable from the entry without the edge `from → to`.
fn reach_without(cfg: &Cfg, from: usize, to: usize) -> Vec<bool> {
    let mut seen = vec![false; cfg.blocks.len()];
    if cfg.blocks.is_empty() {
        return seen;
    }
    let entry = cfg.block_of[0];
    let mut work = vec![entry];
    seen[entry] = true;
    while let Some(b) = work.pop() {
        for &s in &cfg.blocks[b].succs {
            if (b == from && s == to) || seen[s] {
                continue;
            }
            seen[s] = true;
            work.push(s);
        }
    }
    seen
}

/// The warp splits of `sec` and each block's side of them.
pub fn analyze(sec: &Section, cfg: &Cfg, effects: &[Effects]) -> Roles {
    let nb = cfg.blocks.len();
    let tid_in = tid_regs(sec, cfg, effects);
    let mut side = vec![Vec::new(); nb];
    for b in 0..nb {
        let Some((taken, fall)) = split_of(sec, cfg, effects, &tid_in, b) else {
            continue;
        };
        let no_taken = reach_without(cfg, b, taken);
        let no_fall = reach_without(cfg, b, fall);
        for (x, s) in side.iter_mut().enumerate() {
            s.push(match (no_taken[x], no_fall[x]) {
                (false, true) => Some(true),  // only through the taken edge
                (true, false) => Some(false), // only through the fall-through edge
                _ => None,
            });
        }
    }
    Roles { side }
}
