//! What one instruction reads and writes, from the rule table's operand roles: destination and
//! source locations (with register-pair/quad/accumulator widths), memory cells, guards.

use super::bits::{bit_op, BitOp};
pub use super::loc::Secrets;
use super::loc::{loc, locs};
use super::sass::{Insn, Operand, Reg, RegOp};
use super::table::{self, Class, Role, Space};

/// Memory instructions (their address operands and guards are rule-2 sinks), by the rule
/// table's class.
pub fn is_memory(op: &str) -> bool {
    table::lookup(op).is_some_and(|r| is_memory_class(r.class))
}

pub fn is_memory_class(c: Class) -> bool {
    matches!(
        c,
        Class::Load(_)
            | Class::Store(_)
            | Class::Atomic(_)
            | Class::AsyncToShared
            | Class::AsyncFromShared
            | Class::Prefetch
            | Class::Mbarrier
            | Class::Gmma
            | Class::Texture
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
    /// A bit-precise transfer for this instruction (replaces `dests`/`srcs` for the taint of
    /// its results; `srcs` still lists what it reads).
    pub bitop: Option<BitOp>,
    /// The rule-table class of the instruction.
    pub class: Option<Class>,
    /// Cross-lane read: sources are read from the plain state (not the guard's conditional
    /// view: the other lanes need not satisfy this lane's guard facts).
    pub cross_lane: bool,
    /// `SHFL` data sources, also read flow-insensitively (a source lane that is not at this
    /// instruction supplies whatever its register holds).
    pub shuffle_data: Vec<usize>,
    /// `BAR.RED`: deposits its sources into the barrier-result cell; `B2R` reads it.
    pub writes_barrier_result: bool,
    pub reads_barrier_result: bool,
    /// A call to code outside the section (`vprintf`, `malloc`, a function pointer): see
    /// [`external_call`].
    pub external_call: bool,
}

/// What a call to code the audit cannot see does, conservatively: it reads the argument
/// registers (R4..R15) and local memory (arguments passed on the stack), may read global memory
/// and write shared and local memory, and leaves every caller-saved register (R0, R2..R15)
/// secret.
pub fn external_call(e: &mut Effects) {
    e.external_call = true;
    for r in (4..16).map(Reg::R) {
        locs(r, 1, &mut e.srcs);
    }
    for r in std::iter::once(0).chain(2..16).map(Reg::R) {
        locs(r, 1, &mut e.dests);
    }
    e.intrinsic = true;
    e.reads_lmem = true;
    e.reads_smem = true;
    e.writes_smem = true;
    e.smem_intrinsic = true;
    e.writes_lmem = true;
}

/// A global read of a public buffer (block table, `cache_seqlens`, ...): what it loads is not a
/// taint source; the value takes the taint of its address and guard (so a secret address still
/// gives a secret value, besides the rule-2 finding at the read). `LDGSTS` then copies public
/// bytes into shared memory. An atomic's returned value (a tile counter's ticket) takes the
/// taint of its address, guard and operands.
pub fn public_read(e: &mut Effects) {
    match e.class {
        Some(Class::Load(Space::Global | Space::Generic))
        | Some(Class::Atomic(Space::Global | Space::Generic)) => {
            e.intrinsic = false;
            // A generic address based on a global buffer's pointer is not shared or local.
            e.reads_smem = false;
            e.reads_lmem = false;
        }
        Some(Class::AsyncToShared) => e.smem_intrinsic = false,
        _ => {}
    }
}

fn is_conversion(op: &str) -> bool {
    matches!(
        op,
        "F2I" | "I2F" | "F2F" | "I2I" | "F2IP" | "I2FP" | "FRND" | "UF2I" | "UI2F"
    )
}

/// Computes the static read/write sets of `insn`, whose operands have `roles` under the rule
/// table's `class`.
pub fn effects(insn: &Insn, class: Class, roles: &[Role], secrets: &Secrets) -> Effects {
    let op = insn.op();
    let mut e = Effects {
        guard: insn.real_guard().and_then(|g| loc(g.reg)),
        guard_neg: insn.real_guard().map(|g| g.negated).unwrap_or(false),
        class: Some(class),
        ..Default::default()
    };
    let ops = &insn.operands;
    let is_dest = |k: usize| match roles.get(k) {
        Some(Role::DestReg | Role::DestPred) => true,
        Some(Role::AllPreds) => matches!(op, "R2P" | "UR2UP"),
        _ => false,
    };
    let memory = is_memory_class(class);
    let wide_all = insn.has_mod("64") && !memory && !is_conversion(op)
        || matches!(op, "DADD" | "DMUL" | "DFMA" | "DMNMX" | "DSETP" | "DSET");
    let conv64 = is_conversion(op)
        && insn
            .mods()
            .any(|m| matches!(m, "F64" | "U64" | "S64" | "64"));
    let memw = mem_width(insn);
    let gmma = class == Class::Gmma;
    let mma = class == Class::Mma;
    let accw = if gmma { gmma_acc_width(insn) } else { 0 };
    let wide_mul = matches!(op, "IMAD" | "UIMAD") && insn.has_mod("WIDE");
    let first_dest_reg = (0..ops.len()).find(|&k| roles.get(k) == Some(&Role::DestReg));

    // Destinations.
    for (k, o) in ops.iter().enumerate() {
        if !is_dest(k) {
            continue;
        }
        if let Operand::Reg(r) = o {
            let mut w = r.width;
            if Some(k) == first_dest_reg {
                if gmma {
                    w = accw;
                } else if wide_mul || wide_all || op == "CS2R" && !insn.has_mod("32") {
                    w = 2;
                } else if memory || matches!(class, Class::Load(_)) {
                    w = w.max(memw);
                } else if mma {
                    locs(r.reg, 1, &mut e.dests);
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
    for (k, o) in ops.iter().enumerate() {
        if is_dest(k) {
            continue;
        }
        match o {
            Operand::Reg(r) => {
                let mut w = r.width;
                if gmma {
                    let dest = first_dest_reg.and_then(|d| ops[d].as_reg()).map(|d| d.reg);
                    w = if Some(r.reg) == dest { accw } else { 4 };
                } else if wide_all || conv64 || (wide_mul && nsrc == 2) {
                    w = 2;
                } else if mma {
                    w = 4;
                } else if memory && !r.reg.is_pred() {
                    w = w.max(memw);
                }
                let before = e.srcs.len();
                locs(r.reg, w, &mut e.srcs);
                // The value a SHFL passes (its first source) is the cross-lane one.
                if class == Class::Shuffle && nsrc == 0 {
                    e.shuffle_data.extend_from_slice(&e.srcs[before..]);
                }
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
    if class == Class::Texture {
        for o in ops {
            // Vector registers only: uniform operands are texture/sampler handles.
            if let Operand::Reg(RegOp { reg: Reg::R(_), .. }) = o {
                locs(
                    o.as_reg().map(|r| r.reg).unwrap_or(Reg::Zero),
                    4,
                    &mut e.dests,
                );
            }
        }
    }
    // Memory cells, by class.
    match class {
        Class::Load(sp) | Class::Atomic(sp) => {
            match sp {
                Space::Global => e.intrinsic = true,
                Space::Generic => {
                    e.intrinsic = true;
                    e.reads_smem = true;
                    e.reads_lmem = true;
                }
                Space::Shared => e.reads_smem = true,
                Space::Local => e.reads_lmem = true,
                Space::Constant => {}
            }
            if let Class::Atomic(sp) = class {
                store_cells(&mut e, sp);
            }
        }
        Class::Store(sp) => store_cells(&mut e, sp),
        Class::AsyncToShared => {
            e.writes_smem = true;
            e.smem_intrinsic = true;
        }
        Class::Gmma | Class::Texture => e.intrinsic = true,
        Class::Collective | Class::Shuffle => e.cross_lane = true,
        Class::Barrier if insn.has_mod("RED") => {
            e.writes_barrier_result = true;
            e.cross_lane = true;
        }
        Class::BarrierResult => e.reads_barrier_result = true,
        _ => {}
    }
    e.bitop = bit_op(insn, secrets);
    e
}

fn store_cells(e: &mut Effects, sp: Space) {
    match sp {
        Space::Shared => e.writes_smem = true,
        Space::Local => e.writes_lmem = true,
        Space::Generic => {
            e.writes_smem = true;
            e.writes_lmem = true;
        }
        Space::Global | Space::Constant => {}
    }
}
