//! Bit-precise taint transfers.
//!
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

use super::loc::{loc, Cause, Secrets, ALL, NONE, P_BASE, UP_BASE};
use super::sass::{Insn, Operand, Reg};

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
pub(super) fn reg_suffixes(insn: &Insn) -> Vec<Vec<String>> {
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
pub(crate) struct Out {
    pub loc: usize,
    /// Origin when `mask != 0`.
    pub origin: u32,
    pub mask: u32,
    /// Bits that can differ between "written" and "not written" (for a secret guard).
    pub diff: u32,
}

/// Applies a [`BitOp`]; `get` reads (origin, mask) under the instruction's guard. Returns the
/// results and, when some result is newly secret here, where its secret came from.
pub(crate) fn bit_outputs(
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
            let pt = p.map(get).filter(|&(_, m)| m != 0);
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
