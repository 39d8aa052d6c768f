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
//! # Bit-precise rules
//!
//! Under register pressure ptxas packs predicates into single bits of one general register
//! (`@P4 LOP3.LUT R9, R9, 0x40000000, RZ, 0xfc, !PT` … `LOP3.LUT P0, RZ, R9, 0x10000000, RZ,
//! 0xc0, !PT`): one secret bit must not make the other bits secret. So masks move bit by bit
//! through the operations whose bits are independent or merely moved ([`BitOp`]):
//!
//! * **`LOP3.LUT` / `ULOP3.LUT`** (`Rd, Ra, Rb, Rc, lut, Pq` and the predicate form `Pp, Rd, Ra,
//!   Rb, Rc, lut, Pq`): output bit *i* depends only on bit *i* of `Ra`, `Rb`, `Rc`. Immediates and
//!   `RZ` have known bits; a public register (or public constant-bank word) has a public but
//!   *unknown* bit, which may be either value. Output bit *i* is tainted iff there is an
//!   assignment of the unknown public bits (known bits fixed) under which changing the tainted
//!   input bits changes the LUT's output. So an operand the LUT ignores never taints; `AND` with
//!   an immediate whose bit *i* is 0 makes bit *i* public (it is 0); `OR` with bit *i* = 1 makes
//!   it public (it is 1). LUT index = `a<<2 | b<<1 | c` (a = `0xf0`, b = `0xcc`, c = `0xaa`).
//! * The predicate written by the `Pp` form is "result ≠ 0": tainted iff any result bit is.
//!   A secret (non-constant) trailing predicate `Pq` conservatively taints every output.
//! * **Shifts by an immediate** move the mask: `SHF`/`USHF` (funnel of `{hi = Rc : lo = Ra}`,
//!   `.L`/`.R`, `.HI` picks the upper word, `.S32`/`.S64` replicate a tainted sign bit),
//!   `IMAD.SHL` (`Ra · 2^k + Rc`) and `LEA`/`ULEA` without `.HI`/`.X` (`(Ra << k) + Rb`): with a
//!   zero addend the mask is shifted; with any other addend the addition's carries move taint
//!   upward, so every bit at or above the lowest tainted bit is tainted. A carry-out predicate is
//!   tainted iff any input bit is.
//! * **`P2R Rd, PR, Rb, mask`** (`.B1`..`.B3` shift by 8·k) writes predicate *k* into bit *k* for
//!   each set bit *k* of `mask`; the other bits come from `Rb`. **`R2P PR, Ra, mask`** reads bit
//!   *k* of `Ra` into predicate *k* for each set bit of `mask` and leaves the others alone.
//!   `UP2UR`/`UR2UP` likewise for uniform predicates.
//!   A byte-selected source (`R2P PR, R9.B3, 0x50`) reads bits 24 + *k*.
//! * **`MOV`, `UMOV`, `IMAD.MOV` (`RZ, RZ, Rb`), `R2UR`** copy the mask.
//! * **`SEL`/`USEL`/`FSEL Rd, Ra, Rb, Pc`** is a per-bit multiplexer: the union of both sides'
//!   masks, plus, when `Pc` is secret, every bit where the two sides are not known to be equal
//!   (`SEL R9, RZ, 0x40000000, !P4` taints bit 30 only).
//! * **Additions without carry-in** (`IADD3`, `UIADD3`, `VIADD`, `IMAD.IADD Rd, Ra, 0x1, Rc`,
//!   negated addends allowed): bit *i* of a sum depends on bits ≤ *i* of the addends, so every
//!   bit at or above the lowest tainted input bit is tainted; carry-out predicates are tainted
//!   iff any input bit is. `.X` (carry-in) forms stay conservative.
//! * Operands with byte/half selects (`.B1`, `.H1`) other than the `P2R`/`R2P` cases above
//!   make the instruction conservative.
//! * Everything else — arithmetic with carries, multiplication, floating point, conversions,
//!   loads, `PLOP3`, shuffles, register-indexed constants, negated (`-R`) moves — stays
//!   conservative: any tainted input bit taints every bit of every output. Register pairs,
//!   quads and wgmma accumulator ranges are tracked register by register as before.
//!
//! **Guards.** A write under a *public* guard leaves a conditional fact (see [`Cond`]); the
//! plain state is the bitwise join of written and not written. A write under a *secret* guard
//! taints, on top of that join, the bits that can differ between "written" and "not written":
//! for an in-place `LOP3` (destination also a source) exactly the bits the LUT can change given
//! the known operand bits (`OR imm`: the immediate's 1 bits; `AND imm`: its 0 bits); for `P2R
//! Rd, PR, Rd, mask` the inserted bits; for anything else every bit.

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

/// Every bit tainted: the mask of a secret value.
pub const ALL: u32 = u32::MAX;

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
    /// A bit-precise transfer for this instruction (replaces `dests`/`srcs` for the taint of
    /// its results; `srcs` still lists what it reads).
    pub bitop: Option<BitOp>,
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
                } else if wide_all || conv64 || (wide_mul && nsrc == 2) {
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
    e.bitop = bit_op(insn, secrets);
    e
}

/// An input of a bit-precise operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    /// A tracked register: its mask is read from the state.
    Loc(usize),
    /// Known bits: an immediate or `RZ`.
    Const(u32),
    /// Public, bits unknown (a public constant-bank word, a floating immediate).
    Public,
    /// Secret, every bit (a secret kernel parameter).
    Secret,
}

/// Instructions whose taint moves bit by bit (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BitOp {
    /// `LOP3.LUT [pd,] rd, a, b, c, lut, pin`.
    Lop3 {
        rd: Option<usize>,
        pd: Option<usize>,
        src: [Src; 3],
        lut: u8,
        /// The trailing predicate input when it is not constant.
        pin: Option<usize>,
    },
    /// Funnel shift of `{hi : lo}` by an immediate `sh` < 32.
    Funnel {
        rd: usize,
        lo: Src,
        hi: Src,
        sh: u32,
        left: bool,
        hi_word: bool,
        arith: bool,
    },
    /// `(a << sh) + add`, with an optional carry-out predicate.
    ShlAdd {
        rd: usize,
        pd: Option<usize>,
        a: Src,
        sh: u32,
        add: Src,
    },
    /// Copy.
    Mov { rd: usize, a: Src },
    /// `SEL rd, a, b, p`: bit *i* is `p ? a_i : b_i`.
    Sel {
        rd: usize,
        a: Src,
        b: Src,
        p: Option<usize>,
    },
    /// Sum of `adds` (negations allowed) with carry-out predicates `pds`: bit *i* depends on
    /// bits ≤ *i* only.
    Add {
        rd: usize,
        pds: Vec<usize>,
        adds: Vec<Src>,
    },
    /// `P2R`: predicate `loc` into bit `bit`, every other bit from `base` (`keep` = those bits).
    P2r {
        rd: usize,
        preds: Vec<(u32, usize)>,
        base: Src,
        keep: u32,
    },
    /// `R2P`: bit `bit` of `src` into predicate `loc`.
    R2p { src: Src, preds: Vec<(u32, usize)> },
}

/// Parses an integer immediate (`0x7fffffff`, `-0x1`, `12`) as its 32-bit pattern.
fn imm_u32(s: &str) -> Option<u32> {
    let t = s.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t),
    };
    let v: i128 = if let Some(h) = t.strip_prefix("0x") {
        i128::from_str_radix(h, 16).ok()?
    } else {
        t.parse::<i128>().ok()?
    };
    let v = if neg { -v } else { v };
    (-(1i128 << 32)..(1i128 << 32))
        .contains(&v)
        .then_some(v as u32)
}

/// A general-register/uniform operand as a bit source. `bitwise_not_ok`: a `~`/`-` prefix may
/// be a bitwise not (keeps the mask; only for `LOP3`).
fn bit_src(o: &Operand, secrets: &Secrets, bitwise_not_ok: bool) -> Option<Src> {
    match o {
        Operand::Reg(r) => {
            if r.width != 1 || r.reg.is_pred() {
                return None;
            }
            if r.negated && !bitwise_not_ok {
                return None;
            }
            match r.reg {
                Reg::Zero if r.negated => Some(Src::Public),
                Reg::Zero => Some(Src::Const(0)),
                _ => loc(r.reg).map(Src::Loc),
            }
        }
        Operand::Imm(t) => Some(match imm_u32(t) {
            Some(v) => Src::Const(v),
            None => Src::Public,
        }),
        Operand::CBank {
            bank,
            offset,
            index,
        } => {
            if !index.is_empty() {
                return None;
            }
            Some(if secrets.cbank_secret(*bank, *offset, 4, false) {
                Src::Secret
            } else {
                Src::Public
            })
        }
        _ => None,
    }
}

/// Destination general/uniform register: `Some(None)` for `RZ`, `None` if not a plain register.
fn bit_dest(o: &Operand) -> Option<Option<usize>> {
    let r = o.as_reg()?;
    if r.width != 1 || r.negated || r.reg.is_pred() {
        return None;
    }
    Some(loc(r.reg))
}

/// A predicate operand: `Some(None)` for `PT`/`!PT`, `Some(Some(loc))` otherwise.
fn pred_opnd(o: &Operand) -> Option<Option<usize>> {
    let r = o.as_reg()?;
    match r.reg {
        Reg::True => Some(None),
        Reg::P(_) | Reg::UP(_) => Some(loc(r.reg)),
        _ => None,
    }
}

fn imm_of(o: &Operand) -> Option<u32> {
    match o {
        Operand::Imm(t) => imm_u32(t),
        _ => None,
    }
}

/// Byte shift of a `P2R`/`R2P` (`.B1` .. `.B3`).
fn byte_shift(insn: &Insn) -> u32 {
    insn.mods()
        .find_map(|m| match m {
            "B1" => Some(8),
            "B2" => Some(16),
            "B3" => Some(24),
            _ => None,
        })
        .unwrap_or(0)
}

/// Register-operand suffixes other than `.reuse` (byte/half selects such as `R0.B3`, `R2.H1`),
/// per operand, read back from the instruction's text.
fn reg_suffixes(insn: &Insn) -> Vec<Vec<String>> {
    let body = insn.text.trim();
    let body = match body.strip_prefix('@') {
        Some(g) => g.split_once(char::is_whitespace).map(|x| x.1).unwrap_or(""),
        None => body,
    }
    .trim();
    let ops = body
        .split_once(char::is_whitespace)
        .map(|x| x.1)
        .unwrap_or("");
    super::sass::split_top(ops)
        .into_iter()
        .zip(insn.operands.iter())
        .map(|(tok, o)| match o {
            Operand::Reg(_) => tok
                .trim_end_matches('|')
                .split('.')
                .skip(1)
                .filter(|m| *m != "reuse")
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// Recognises the instructions with a bit-precise transfer; `None` means conservative.
pub fn bit_op(insn: &Insn, secrets: &Secrets) -> Option<BitOp> {
    let op = insn.op();
    let ops = &insn.operands;
    let mods: Vec<&str> = insn.mods().collect();
    let suffixes = reg_suffixes(insn);
    // Byte select of operand `k` (`R0.B3`), for P2R/R2P.
    let operand_byte = |k: usize| -> Option<u32> {
        match suffixes.get(k).map(|v| v.as_slice()) {
            None | Some([]) => Some(0),
            Some([b]) => match b.as_str() {
                "B0" => Some(0),
                "B1" => Some(8),
                "B2" => Some(16),
                "B3" => Some(24),
                _ => None,
            },
            _ => None,
        }
    };
    if !matches!(op, "P2R" | "UP2UR" | "R2P" | "UR2UP") && suffixes.iter().any(|v| !v.is_empty()) {
        return None;
    }
    match op {
        "SEL" | "USEL" | "FSEL" if mods.is_empty() && ops.len() == 4 => Some(BitOp::Sel {
            rd: bit_dest(&ops[0])??,
            a: bit_src(&ops[1], secrets, false)?,
            b: bit_src(&ops[2], secrets, false)?,
            p: pred_opnd(&ops[3])?,
        }),
        "IADD3" | "UIADD3" | "VIADD" | "IMAD"
            if mods == ["IADD"] || (op != "IMAD" && mods.is_empty()) =>
        {
            // Additions without carry-in: (dest, [carry-out predicates], addends).
            let rd = bit_dest(ops.first()?)??;
            let mut k = 1;
            let mut pds = Vec::new();
            while let Some(Operand::Reg(r)) = ops.get(k) {
                if !r.reg.is_pred() {
                    break;
                }
                if r.negated {
                    return None;
                }
                pds.push(loc(r.reg)?);
                k += 1;
            }
            let srcs = &ops[k..];
            let want = match op {
                "VIADD" => 2,
                _ => 3,
            };
            if srcs.len() != want {
                return None;
            }
            let mut adds = Vec::new();
            for (j, o) in srcs.iter().enumerate() {
                if op == "IMAD" && j == 1 {
                    // IMAD.IADD Rd, Ra, 0x1, Rc: a multiplier of 1.
                    if imm_of(o) != Some(1) {
                        return None;
                    }
                    continue;
                }
                // A negated addend (-R) is ~R + 1: still low-to-high.
                adds.push(match bit_src(o, secrets, true)? {
                    Src::Public if !matches!(o, Operand::Imm(_) | Operand::CBank { .. }) => {
                        return None
                    }
                    x => x,
                });
            }
            Some(BitOp::Add { rd, pds, adds })
        }
        "LOP3" | "ULOP3" if mods == ["LUT"] => {
            let (pd, rest) = match ops.first()?.as_reg() {
                Some(r) if r.reg.is_pred() => (pred_opnd(&ops[0])?, &ops[1..]),
                _ => (None, &ops[..]),
            };
            if !(rest.len() == 5 || rest.len() == 6) {
                return None;
            }
            let rd = bit_dest(&rest[0])?;
            let src = [
                bit_src(&rest[1], secrets, true)?,
                bit_src(&rest[2], secrets, true)?,
                bit_src(&rest[3], secrets, true)?,
            ];
            let lut = u8::try_from(imm_of(&rest[4])?).ok()?;
            let pin = match rest.get(5) {
                Some(o) => pred_opnd(o)?,
                None => None,
            };
            Some(BitOp::Lop3 {
                rd,
                pd,
                src,
                lut,
                pin,
            })
        }
        "SHF" | "USHF" if ops.len() == 4 => {
            let left = mods.contains(&"L");
            if left == mods.contains(&"R") {
                return None;
            }
            if !mods
                .iter()
                .all(|m| matches!(*m, "L" | "R" | "U32" | "S32" | "U64" | "S64" | "HI" | "W"))
            {
                return None;
            }
            let sh = imm_of(&ops[2]).filter(|&v| v < 32)?;
            Some(BitOp::Funnel {
                rd: bit_dest(&ops[0])??,
                lo: bit_src(&ops[1], secrets, false)?,
                hi: bit_src(&ops[3], secrets, false)?,
                sh,
                left,
                hi_word: mods.contains(&"HI"),
                arith: mods.contains(&"S32") || mods.contains(&"S64"),
            })
        }
        "IMAD" if ops.len() == 4 && (mods == ["SHL", "U32"] || mods == ["SHL"]) => {
            let k = imm_of(&ops[2]).filter(|v| v.is_power_of_two())?;
            Some(BitOp::ShlAdd {
                rd: bit_dest(&ops[0])??,
                pd: None,
                a: bit_src(&ops[1], secrets, false)?,
                sh: k.trailing_zeros(),
                add: bit_src(&ops[3], secrets, false)?,
            })
        }
        "LEA" | "ULEA" if mods.is_empty() => {
            let (pd, rest) = match ops.get(1).and_then(|o| o.as_reg()) {
                Some(r) if r.reg.is_pred() => (pred_opnd(&ops[1])?, &ops[2..]),
                _ => (None, &ops[1..]),
            };
            if rest.len() != 3 {
                return None;
            }
            let sh = imm_of(&rest[2]).filter(|&v| v < 32)?;
            Some(BitOp::ShlAdd {
                rd: bit_dest(&ops[0])??,
                pd,
                a: bit_src(&rest[0], secrets, false)?,
                sh,
                add: bit_src(&rest[1], secrets, false)?,
            })
        }
        "MOV" | "UMOV" | "R2UR" if mods.is_empty() && ops.len() == 2 => Some(BitOp::Mov {
            rd: bit_dest(&ops[0])??,
            a: bit_src(&ops[1], secrets, false)?,
        }),
        "IMAD" if ops.len() == 4 && (mods == ["MOV", "U32"] || mods == ["MOV"]) => {
            let zero = |o: &Operand| bit_src(o, secrets, false) == Some(Src::Const(0));
            if !(zero(&ops[1]) && zero(&ops[2])) {
                return None;
            }
            Some(BitOp::Mov {
                rd: bit_dest(&ops[0])??,
                a: bit_src(&ops[3], secrets, false)?,
            })
        }
        "P2R" | "UP2UR" if ops.len() == 4 => {
            let base_p = match ops[1].as_reg()?.reg {
                Reg::PR => P_BASE,
                Reg::UPR => UP_BASE,
                _ => return None,
            };
            let mask = imm_of(&ops[3]).filter(|&m| m <= 0xff)?;
            if suffixes.iter().any(|v| !v.is_empty()) {
                return None;
            }
            let sh = byte_shift(insn);
            let preds = (0..7u32)
                .filter(|k| mask >> k & 1 == 1)
                .map(|k| (sh + k, base_p + k as usize))
                .collect();
            Some(BitOp::P2r {
                rd: bit_dest(&ops[0])??,
                preds,
                base: bit_src(&ops[2], secrets, false)?,
                keep: !(mask << sh),
            })
        }
        "R2P" | "UR2UP" if ops.len() == 3 => {
            let base_p = match ops[0].as_reg()?.reg {
                Reg::PR => P_BASE,
                Reg::UPR => UP_BASE,
                _ => return None,
            };
            let mask = imm_of(&ops[2]).filter(|&m| m <= 0xff)?;
            let sh = byte_shift(insn) + operand_byte(1)?;
            if sh > 24 {
                return None;
            }
            let preds = (0..7u32)
                .filter(|k| mask >> k & 1 == 1)
                .map(|k| (sh + k, base_p + k as usize))
                .collect();
            Some(BitOp::R2p {
                src: bit_src(&ops[1], secrets, false)?,
                preds,
            })
        }
        _ => None,
    }
}

/// Per-bit class of a `LOP3` operand: known 0, known 1, public unknown, tainted.
const K0: u8 = 0;
const K1: u8 = 1;
const PU: u8 = 2;
const TT: u8 = 3;

/// (known-bits mask, known values, taint mask) of an operand.
#[derive(Clone, Copy)]
struct Bits {
    known: u32,
    val: u32,
    taint: u32,
}

impl Bits {
    fn class(&self, i: u32) -> u8 {
        if self.taint >> i & 1 == 1 {
            TT
        } else if self.known >> i & 1 == 1 {
            if self.val >> i & 1 == 1 {
                K1
            } else {
                K0
            }
        } else {
            PU
        }
    }
}

fn lut_bit(lut: u8, x: u32) -> bool {
    lut >> x & 1 == 1
}

/// Is input combination `x` (bit 2 = a, 1 = b, 0 = c) consistent with the known classes?
fn consistent(x: u32, cls: [u8; 3]) -> bool {
    (0..3).all(|k| {
        let b = (x >> (2 - k)) & 1;
        match cls[k] {
            K0 => b == 0,
            K1 => b == 1,
            _ => true,
        }
    })
}

/// Can flipping the tainted inputs change the output, for some value of the unknown public ones?
fn lut_bit_tainted(lut: u8, cls: [u8; 3]) -> bool {
    let tainted: u32 = (0..3).filter(|&k| cls[k] == TT).map(|k| 1 << (2 - k)).sum();
    if tainted == 0 {
        return false;
    }
    (0..8u32).filter(|&x| consistent(x, cls)).any(|x| {
        (0..8u32)
            .filter(|&y| (x ^ y) & !tainted == 0 && consistent(y, cls))
            .any(|y| lut_bit(lut, x) != lut_bit(lut, y))
    })
}

/// Can the output differ from input `j`'s bit (an in-place write), for some unknown inputs?
fn lut_bit_can_change(lut: u8, cls: [u8; 3], j: usize) -> bool {
    (0..8u32)
        .filter(|&x| consistent(x, cls))
        .any(|x| lut_bit(lut, x) != ((x >> (2 - j)) & 1 == 1))
}

/// Per output bit, `f(classes of the three operands' bit i)`, memoised over the 64 class
/// combinations.
fn per_bit(ops: &[Bits; 3], f: impl Fn([u8; 3]) -> bool) -> u32 {
    let mut memo = [0u8; 64];
    let mut out = 0u32;
    for i in 0..32 {
        let cls = [ops[0].class(i), ops[1].class(i), ops[2].class(i)];
        let key = (cls[0] | cls[1] << 2 | cls[2] << 4) as usize;
        if memo[key] == 0 {
            memo[key] = if f(cls) { 2 } else { 1 };
        }
        if memo[key] == 2 {
            out |= 1 << i;
        }
    }
    out
}

/// Tainted output bits of `LOP3` with operands `ops`.
fn lop3_taint(lut: u8, ops: &[Bits; 3]) -> u32 {
    if ops.iter().all(|o| o.taint == 0) {
        return 0;
    }
    per_bit(ops, |cls| lut_bit_tainted(lut, cls))
}

/// Bits an in-place `LOP3` (destination = operand `j`) can change.
fn lop3_changes(lut: u8, ops: &[Bits; 3], j: usize) -> u32 {
    let mut o = *ops;
    for b in o.iter_mut() {
        b.taint = 0;
    }
    per_bit(&o, |cls| lut_bit_can_change(lut, cls, j))
}

/// Every bit at or above the lowest set bit of `x` (where carries can carry taint).
fn smear_up(x: u32) -> u32 {
    if x == 0 {
        0
    } else {
        !((x & x.wrapping_neg()) - 1)
    }
}

/// One result of a bit-precise transfer.
struct Out {
    loc: usize,
    /// Origin when `mask != 0`.
    origin: u32,
    mask: u32,
    /// Bits that can differ between "written" and "not written" (for a secret guard).
    diff: u32,
}

/// Applies a [`BitOp`]; `get` reads (origin, mask) under the instruction's guard. Returns the
/// results and, when some result is newly secret here, where its secret came from.
fn bit_outputs(
    i: usize,
    b: &BitOp,
    get: &dyn Fn(usize) -> (u32, u32),
) -> (Vec<Out>, Option<Cause>) {
    let me = i as u32;
    let rd_of = |s: &Src| -> (Bits, u32) {
        match *s {
            Src::Loc(l) => {
                let (o, m) = get(l);
                (
                    Bits {
                        known: 0,
                        val: 0,
                        taint: m,
                    },
                    o,
                )
            }
            Src::Const(v) => (
                Bits {
                    known: ALL,
                    val: v,
                    taint: 0,
                },
                NONE,
            ),
            Src::Public => (
                Bits {
                    known: 0,
                    val: 0,
                    taint: 0,
                },
                NONE,
            ),
            Src::Secret => (
                Bits {
                    known: 0,
                    val: 0,
                    taint: ALL,
                },
                NONE,
            ),
        }
    };
    // Why a result of this instruction is secret: the first secret input.
    let cause_of = |srcs: &[Src]| -> Option<Cause> {
        srcs.iter().find_map(|s| match *s {
            Src::Secret => Some(Cause::Source),
            Src::Loc(l) => {
                let (o, m) = get(l);
                (m != 0).then_some(Cause::From(o))
            }
            _ => None,
        })
    };
    let mut outs = Vec::new();
    let mut cause = None;
    let push = |outs: &mut Vec<Out>, loc: usize, mask: u32, diff: u32, origin: u32| {
        outs.push(Out {
            loc,
            origin: if mask == 0 { NONE } else { origin },
            mask,
            diff,
        });
    };
    match b {
        BitOp::Lop3 {
            rd,
            pd,
            src,
            lut,
            pin,
        } => {
            let bits = [rd_of(&src[0]).0, rd_of(&src[1]).0, rd_of(&src[2]).0];
            let pin_t = pin.map(get).filter(|&(_, m)| m != 0);
            let mut mask = lop3_taint(*lut, &bits);
            if pin_t.is_some() {
                mask = ALL;
            }
            if let Some(d) = rd {
                // In place: the destination is also an operand.
                let j = src.iter().position(|s| *s == Src::Loc(*d));
                let diff = match j {
                    Some(j) => lop3_changes(*lut, &bits, j),
                    None => ALL,
                };
                // Bits only passed through from the destination itself keep its origin (short
                // chains through long packing sequences).
                let (old_o, old_m) = get(*d);
                let pass = pin_t.is_none()
                    && j.is_some()
                    && mask & !old_m == 0
                    && src
                        .iter()
                        .all(|s| *s == Src::Loc(*d) || rd_of(s).0.taint == 0);
                if pass {
                    push(&mut outs, *d, mask, diff, old_o);
                } else {
                    push(&mut outs, *d, mask, diff, me);
                    if mask != 0 {
                        cause = cause_of(src);
                    }
                }
            }
            if let Some(p) = pd {
                let m = if mask != 0 { ALL } else { 0 };
                push(&mut outs, *p, m, ALL, me);
                if m != 0 && cause.is_none() {
                    cause = cause_of(src);
                }
            }
            if cause.is_none() && pin_t.is_some() && outs.iter().any(|o| o.origin == me) {
                cause = pin_t.map(|(o, _)| Cause::From(o));
            }
        }
        BitOp::Funnel {
            rd,
            lo,
            hi,
            sh,
            left,
            hi_word,
            arith,
        } => {
            let (lm, hm) = (rd_of(lo).0.taint, rd_of(hi).0.taint);
            let v = (hm as u64) << 32 | lm as u64;
            let s = if *left {
                v << sh
            } else {
                let mut s = v >> sh;
                if *arith && hm >> 31 & 1 == 1 && *sh > 0 {
                    s |= !(u64::MAX >> sh);
                }
                s
            };
            let mask = if *hi_word { (s >> 32) as u32 } else { s as u32 };
            push(&mut outs, *rd, mask, ALL, me);
            if mask != 0 {
                cause = cause_of(&[*lo, *hi]);
            }
        }
        BitOp::ShlAdd { rd, pd, a, sh, add } => {
            let (am, cm) = (rd_of(a).0.taint, rd_of(add).0.taint);
            let shifted = am << sh;
            let mask = if *add == Src::Const(0) {
                shifted
            } else {
                smear_up(shifted | cm)
            };
            push(&mut outs, *rd, mask, ALL, me);
            if let Some(p) = pd {
                let m = if am | cm != 0 { ALL } else { 0 };
                push(&mut outs, *p, m, ALL, me);
            }
            if outs.iter().any(|o| o.mask != 0) {
                cause = cause_of(&[*a, *add]);
            }
        }
        BitOp::Sel { rd, a, b, p } => {
            let (ba, bb) = (rd_of(a).0, rd_of(b).0);
            let pt = p.map(|l| get(l)).filter(|&(_, m)| m != 0);
            let mut mask = ba.taint | bb.taint;
            if pt.is_some() {
                // A secret selector taints the bits where the two sides may differ.
                let same = ba.known & bb.known & !(ba.val ^ bb.val);
                mask |= !same;
            }
            push(&mut outs, *rd, mask, ALL, me);
            if mask != 0 {
                cause = cause_of(&[*a, *b]).or(pt.map(|(o, _)| Cause::From(o)));
            }
        }
        BitOp::Add { rd, pds, adds } => {
            let m = adds.iter().fold(0, |m, s| m | rd_of(s).0.taint);
            let mask = smear_up(m);
            push(&mut outs, *rd, mask, ALL, me);
            for &p in pds {
                push(&mut outs, p, if m != 0 { ALL } else { 0 }, ALL, me);
            }
            if m != 0 {
                cause = cause_of(adds);
            }
        }
        BitOp::Mov { rd, a } => {
            let mask = rd_of(a).0.taint;
            push(&mut outs, *rd, mask, ALL, me);
            if mask != 0 {
                cause = cause_of(&[*a]);
            }
        }
        BitOp::P2r {
            rd,
            preds,
            base,
            keep,
        } => {
            let mut mask = rd_of(base).0.taint & keep;
            let mut pc = None;
            for &(bit, p) in preds {
                let (o, m) = get(p);
                if m != 0 {
                    mask |= 1 << bit;
                    pc = pc.or(Some(Cause::From(o)));
                }
            }
            let diff = if *base == Src::Loc(*rd) { !keep } else { ALL };
            push(&mut outs, *rd, mask, diff, me);
            if mask != 0 {
                cause = pc.or_else(|| cause_of(&[*base]));
            }
        }
        BitOp::R2p { src, preds } => {
            let m = rd_of(src).0.taint;
            for &(bit, p) in preds {
                let pm = if m >> bit & 1 == 1 { ALL } else { 0 };
                push(&mut outs, p, pm, ALL, me);
            }
            if outs.iter().any(|o| o.mask != 0) {
                cause = cause_of(&[*src]);
            }
        }
    }
    (outs, cause)
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
    let gv = e.guard.map(|l| (l, e.guard_neg));
    let mut cause = None;
    let src_taint = e.srcs.iter().map(|&l| st.get(l, gv).0).find(|&v| v != NONE);
    let mut weak_val = NONE;
    let outs: Vec<Out> = match &e.bitop {
        Some(b) if !e.public_result => {
            let (o, c) = bit_outputs(i, b, &|l| st.get(l, gv));
            cause = c;
            o
        }
        _ => {
            if e.intrinsic && !e.public_result {
                cause = Some(Cause::Source);
            }
            if !e.public_result {
                if e.reads_smem && st.t[SMEM] != NONE {
                    cause = Some(Cause::From(st.t[SMEM]));
                }
                if e.reads_lmem && st.t[LMEM] != NONE {
                    cause = cause.or(Some(Cause::From(st.t[LMEM])));
                }
                if cause.is_none() {
                    cause = src_taint.map(Cause::From);
                }
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
    let redefined = outs
        .iter()
        .map(|o| o.loc)
        .chain(if e.bitop.is_none() || e.public_result {
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
    if e.writes_lmem && st.t[LMEM] == NONE && (src_taint.is_some() || g.is_some()) {
        st.t[LMEM] = i as u32;
        st.m[LMEM] = ALL;
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

    /// Runs straight-line `body` from a public state and returns the final state.
    fn state_after(body: &str) -> State {
        let listing =
            format!("\t.section\t.text.k,\"ax\",@progbits\n        .type k,@function\nk:\n{body}");
        let secs = sass::parse_listing(&listing);
        let mut st = State::public();
        for (i, insn) in secs[0].insns.iter().enumerate() {
            transfer(i, &effects(insn, &Secrets::default()), &mut st);
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
