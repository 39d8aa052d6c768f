//! The audit's tracked locations (registers, predicates, shared and local memory, the barrier
//! result) as indices, what made a value secret, and which parameters and reads are secret:
//! the vocabulary the bit-level, effect and taint passes share.

use super::sass::Reg;

pub const NONE: u32 = u32::MAX;
pub const R_BASE: usize = 0; // R0..R254
pub const UR_BASE: usize = 255; // UR0..UR62
pub const P_BASE: usize = 255 + 63; // P0..P6
pub const UP_BASE: usize = P_BASE + 7; // UP0..UP6
pub const SMEM: usize = UP_BASE + 7;
pub const LMEM: usize = SMEM + 1;
/// The CTA's barrier-reduction result (`BAR.RED` deposits, `B2R` reads).
pub const BARRES: usize = LMEM + 1;
pub const NLOC: usize = BARRES + 1;

/// Every bit tainted: the mask of a secret value.
pub const ALL: u32 = u32::MAX;

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
        LMEM => "local memory".into(),
        _ => "barrier result".into(),
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

/// Where a secret value came from when an instruction made its destinations secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The instruction itself is a source (global load, wgmma, secret parameter).
    Source,
    /// The secret input was written by this instruction.
    From(u32),
}

/// Parameter facts needed to decide whether a constant-bank read is secret, and which global
/// reads are not secret.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    /// Constant-bank-0 byte ranges `[start, end)` of secret parameters.
    pub ranges: Vec<(u32, u32)>,
    /// Indices (sorted) of the instructions whose global read is proven to read a public buffer
    /// (`provenance`): see `effects::public_read`.
    pub public_reads: Vec<usize>,
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
