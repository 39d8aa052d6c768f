//! Pointer provenance: which global loads read a *public buffer* (docs/design.md §1, "Metadata": a
//! paged KV cache's block table, `cache_seqlens`, `cu_seqlens`, split sizes), so that their
//! values are public instead of taint sources.
//!
//! A public buffer is named by its pointer: 8 bytes of constant bank 0, the kernel parameter
//! space (a whole pointer parameter, or a pointer field inside a `__grid_constant__` struct).
//! Everything else global memory holds stays secret.
//!
//! # The rule
//!
//! A global read (`LDG`, generic `LD`, their `.CONSTANT` and vector forms, and the global side
//! of `LDGSTS`) reads public buffer X when, **at that instruction, on every path to it**, its
//! address operand is one 64-bit register pair `Rn.64` (or `URn.64`) holding X's pointer plus an
//! offset, other address terms (an immediate, a 32-bit uniform register) being offsets; and the
//! kernel never writes through a pointer that may derive from X. The taint analysis then takes
//! the loaded value's taint from the address (and guard) instead of making it a source: a
//! public address gives a public value, a secret one is a rule-2 finding at the load and a
//! secret value, exactly as before.
//!
//! "X's pointer plus an offset" is tracked per 32-bit register as a [`Prov`]:
//!
//! * `Lo(X)` / `Hi(X)`: the low / high word of X's pointer plus an offset. Made by reading the
//!   pointer's words from the constant bank (`LDC`, `ULDC`, `.64` forms, or a constant-bank
//!   operand of an add); kept by copies (`MOV`, `IMAD.MOV`, `UMOV`, `R2UR`, `MOV Rd, URn`) and by
//!   additions in which the pointer word is the **only** addend that derives from any public
//!   pointer and is not negated: `IADD3`/`UIADD3` (and `.X`), `VIADD`, `IADD`, `IMAD`/`UIMAD`
//!   (the pointer as the addend `c`, or as `a`/`b` multiplied by the immediate 1; `.X`, `.MOV`,
//!   `.IADD`), `LEA`/`ULEA` and `LEA.HI(.X)(.SX32)` (the pointer as the added operand), `ISCADD`;
//!   `IMAD.WIDE(.U32)`/`UIMAD.WIDE` whose 64-bit addend is the pointer pair gives the pair. A
//!   select (`SEL`/`USEL`) of two values keeps what both have in common.
//! * `Carry(X)`: the carry out of a low-word addition on X; a high-word addition on `Hi(X)` may
//!   take it (or a carry that derives from no public pointer) as its carry-in.
//! * `May(S)`: anything else, with S the public buffers the value may derive from by any data
//!   flow (through registers, predicates, and flow-insensitively through shared, local and
//!   global memory, shuffles and other lanes' registers). `May(∅)` is a value that derives from
//!   no public pointer; only such values may be the offsets of an address.
//!
//! Offsets are not restricted beyond that: their *taint* is what the taint analysis checks. Any
//! other instruction (multiplications of the pointer, shifts, logic, 64-bit shifts, conversions,
//! loads, spills and reloads, shuffles) gives `May`, so an unknown derivation is never a public
//! buffer: the load stays secret (fail safe).
//!
//! **Reads of public buffers.** A value loaded from memory may derive from any pointer ever
//! stored there (flow-insensitively, one cell per space). A read proven to be of public buffer X
//! while the kernel never writes X gives a value that derives from no pointer: X holds what the
//! host put there (a pointer the host stored is already outside what this proves, below). The
//! analysis assumes no buffer written, and is redone with a buffer written as soon as it finds
//! a write of it. A read (or an atomic's old value) proven to be of a written X gives what X's
//! own cell holds: the values of every write whose address may derive from X's pointer (the
//! writes above), flow-insensitively — not the whole global cell, which other writes fill too
//! (an output written from a shuffle that may read another lane's copy of X's pointer). Since
//! every write that may reach X feeds X's cell, this relies on nothing the global cell did not:
//! only on the caller's contract below (no other pointer aliases X, offsets stay inside it).
//!
//! **Other lanes.** A shuffle or vote reads registers of other lanes of its warp, which need
//! not be at the same instruction: their sources are read flow-insensitively, as whatever the
//! register holds anywhere in the kernel — except in blocks that a warp split puts on the other
//! side from the reader's ([`super::roles`]: `if (threadIdx.x < 128)` in a warp-specialised
//! kernel), which no lane of the reader's warp ever runs.
//!
//! **Joins.** At a CFG merge a register keeps `Lo(X)`/`Hi(X)`/`Carry(X)` only when every
//! incoming path has the same; otherwise it becomes `May` of the union. A write under a guard
//! leaves the join of the old and new value (plus the fact "under this guard, the new value",
//! which reads under the same guard see, as the taint analysis does for predicated code). So a
//! register that is X's pointer on one path (or lane) and K's on another is not X's.
//!
//! **Writes.** A store, atomic, reduction, bulk copy, tensor store, surface write or call to code
//! outside the kernel whose address (or argument) may derive from X's pointer (`May` ∋ X) is a
//! write of X. Tensor loads (`UTMALDG`) and `LDGSTS` write shared memory only, whatever their
//! coordinates derive from. A written buffer stays public only when every write of it stores
//! public values at a public address under a public guard — a synchronisation counter that
//! CTAs increment and poll, whose contents are then public values written at times that
//! depend on scheduling only. The caller ([`super::audit_section_with`]) decides that against
//! the taint analysis ([`Provenance::writes_public`]); any write of a secret (or at a secret
//! address, or under a secret guard) makes every read of X secret: such a buffer is not metadata.
//!
//! **What this does not prove** (docs/security.md, "Metadata"): that the offset stays inside X (an
//! out-of-range block-table entry or index, or an offset that reaches another buffer, reads
//! whatever lies there, as public); that no other pointer aliases X (a pointer parameter equal to
//! X, or stored in memory by the host, is not X's derivation here); that nobody else (the host,
//! another kernel) writes X while the kernel runs. Those are the caller's contract.

use super::cfg::Cfg;
use super::effects::{mem_operand_locs, mem_width, Effects};
use super::sass::{Insn, Operand, Reg, Section};
use super::table::{self, Class, Role, Space};
use super::taint::{self, loc, NLOC, P_BASE, SMEM};

/// The most public buffers one kernel may declare.
pub const MAX_BUFFERS: usize = 64;

/// What a 32-bit register (or predicate) holds with respect to the public pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prov {
    /// Low word of public pointer X plus an offset.
    Lo(u8),
    /// High word of public pointer X plus an offset.
    Hi(u8),
    /// Carry out of a low-word addition on X.
    Carry(u8),
    /// May derive from the public pointers in the bit set (none: `May(0)`).
    May(u64),
}

/// A value that derives from no public pointer.
pub const NO: Prov = Prov::May(0);

impl Prov {
    /// The public pointers this value may derive from.
    pub fn set(self) -> u64 {
        match self {
            Prov::Lo(x) | Prov::Hi(x) | Prov::Carry(x) => 1u64 << x,
            Prov::May(s) => s,
        }
    }
    /// What two paths (or lanes) agree on.
    pub fn join(self, o: Prov) -> Prov {
        if self == o {
            self
        } else {
            Prov::May(self.set() | o.set())
        }
    }
    /// Read negated, complemented or as an absolute value: no longer the pointer.
    fn negated(self) -> Prov {
        Prov::May(self.set())
    }
}

/// The public-buffer pointers of one kernel: constant-bank-0 offsets of their 8 bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slots {
    pub starts: Vec<u32>,
}

impl Slots {
    fn all(&self) -> u64 {
        if self.starts.len() >= 64 {
            u64::MAX
        } else {
            (1u64 << self.starts.len()) - 1
        }
    }
    /// The 32-bit word of constant bank `bank` at `offset` (register-indexed if `indexed`).
    fn word(&self, bank: Option<u32>, offset: i64, indexed: bool) -> Prov {
        match bank {
            Some(0) if !indexed => {}
            // A register-chosen bank or offset: any pointer may be read.
            Some(0) | None => return Prov::May(self.all()),
            // Another bank holds no parameter.
            Some(_) => return NO,
        }
        for (x, &s) in self.starts.iter().enumerate() {
            let s = s as i64;
            if offset == s {
                return Prov::Lo(x as u8);
            }
            if offset == s + 4 {
                return Prov::Hi(x as u8);
            }
            if offset > s - 4 && offset < s + 8 {
                return Prov::May(1 << x);
            }
        }
        NO
    }
}

/// Memory cells, flow-insensitive: which public pointers a value stored there may derive from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Cells {
    global: u64,
    shared: u64,
    local: u64,
    barrier: u64,
    /// Per public buffer: what the writes that may reach it (a write whose address may derive
    /// from its pointer) store there; a part of `global`, read by the reads proven to be of it.
    buffers: Vec<u64>,
}

impl Cells {
    fn new(nbuf: usize) -> Cells {
        Cells {
            buffers: vec![0; nbuf],
            ..Default::default()
        }
    }
}

/// A register's provenance under a guard (see the module comment, "Joins").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fact {
    loc: usize,
    guard: usize,
    neg: bool,
    val: Prov,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    v: Vec<Prov>,
    cond: Vec<Fact>,
}

impl State {
    fn entry() -> State {
        State {
            v: vec![NO; NLOC],
            cond: Vec::new(),
        }
    }
    fn get(&self, l: usize, guard: Option<(usize, bool)>) -> Prov {
        if let Some((g, neg)) = guard {
            if let Some(c) = self
                .cond
                .iter()
                .rev()
                .find(|c| c.loc == l && c.guard == g && c.neg == neg)
            {
                return c.val;
            }
        }
        self.v[l]
    }
}

fn join_into(dst: &mut State, src: &State) -> bool {
    let old = dst.v.clone();
    let mut changed = false;
    for l in 0..NLOC {
        let j = dst.v[l].join(src.v[l]);
        if j != dst.v[l] {
            dst.v[l] = j;
            changed = true;
        }
    }
    let mut keys: Vec<(usize, usize, bool)> = dst
        .cond
        .iter()
        .chain(src.cond.iter())
        .map(|c| (c.loc, c.guard, c.neg))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let val_in = |cs: &[Fact], v: &[Prov], k: (usize, usize, bool)| {
        cs.iter()
            .find(|c| (c.loc, c.guard, c.neg) == k)
            .map(|c| c.val)
            .unwrap_or(v[k.0])
    };
    let mut cond = Vec::new();
    for k in keys {
        let val = val_in(&dst.cond, &old, k).join(val_in(&src.cond, &src.v, k));
        if val != dst.v[k.0] {
            cond.push(Fact {
                loc: k.0,
                guard: k.1,
                neg: k.2,
                val,
            });
        }
    }
    if cond != dst.cond {
        dst.cond = cond;
        changed = true;
    }
    changed
}

/// One instruction, ready for the transfer: its operand roles and read/write sets.
struct Step<'a> {
    insn: &'a Insn,
    class: Class,
    roles: Vec<Role>,
    e: &'a Effects,
    /// A plain guarded `BRA` to a labelled target: (guard, negated, target index).
    branch: Option<(usize, bool, usize)>,
    /// The warp-role class of its block (an index into [`Shared::ever`]).
    role: usize,
}

/// The guarded `@P BRA target` of `insn`, if it is one: taken exactly when the guard holds.
fn guarded_branch(sec: &Section, insn: &Insn, e: &Effects) -> Option<(usize, bool, usize)> {
    let plain = insn.op() == "BRA"
        && insn.mods().all(|m| m == "U")
        && insn.operands.len() == 1
        && matches!(insn.operands[0], Operand::Label(_));
    let target = sec.labels.get(insn.label_target()?).copied()?;
    (plain && target < sec.insns.len())
        .then_some(())
        .and(e.guard)
        .map(|g| (g, e.guard_neg, target))
}

/// On an edge where guard `g` (negated if `neg`) is known to hold, the writes made under it
/// happened: its facts become the plain values.
fn assume(st: &mut State, g: usize, neg: bool) {
    for c in st.cond.clone() {
        if c.guard == g && c.neg == neg {
            st.v[c.loc] = c.val;
        }
    }
}

/// Flow-insensitive facts of one round: memory cells and what any lane's register may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shared {
    cells: Cells,
    /// Per warp-role class, per location: the public pointers any lane's register may hold in
    /// that class's blocks.
    ever: Vec<Vec<u64>>,
    /// Per class: the classes whose blocks lanes of one warp may run besides it (itself too).
    peers: Vec<Vec<usize>>,
    /// Public buffers this round takes as written by the kernel (bit per buffer).
    written: u64,
}

/// The provenance of every operand an instruction reads, as seen under its guard.
struct Reader<'a> {
    st: &'a State,
    view: Option<(usize, bool)>,
    slots: &'a Slots,
}

impl Reader<'_> {
    fn loc(&self, l: usize) -> Prov {
        self.st.get(l, self.view)
    }
    /// Word `k` (0: the register itself, 1: the next one of a pair) of operand `o`.
    fn operand(&self, o: &Operand, k: usize) -> Prov {
        match o {
            Operand::Reg(r) => {
                let p = r
                    .reg
                    .offset(k)
                    .and_then(loc)
                    .map(|l| self.loc(l))
                    .unwrap_or(NO);
                if r.negated {
                    p.negated()
                } else {
                    p
                }
            }
            Operand::CBank {
                bank,
                offset,
                index,
            } => {
                // `c[0x0][RZ]` is not indexed.
                let indexed = index.iter().any(|r| r.reg != Reg::Zero);
                let p = self.slots.word(*bank, offset + 4 * k as i64, indexed);
                let idx = index
                    .iter()
                    .flat_map(taint::operand_locs)
                    .fold(0, |s, l| s | self.loc(l).set());
                if idx != 0 {
                    Prov::May(p.set() | idx)
                } else {
                    p
                }
            }
            _ => NO,
        }
    }
    /// Every public pointer an operand may derive from (both words of a constant-bank pair).
    fn operand_set(&self, o: &Operand) -> u64 {
        match o {
            Operand::CBank { .. } => self.operand(o, 0).set() | self.operand(o, 1).set(),
            Operand::Reg(r) => (0..r.width.max(1)).fold(0, |s, k| s | self.operand(o, k).set()),
            Operand::Mem { .. } => 0,
            _ => 0,
        }
    }
}

fn operands_with(step: &Step, role: Role) -> Vec<usize> {
    (0..step.insn.operands.len())
        .filter(|&k| step.roles.get(k) == Some(&role))
        .collect()
}

/// An addition's result: the single pointer word among its addends, when every other operand
/// derives from no public pointer and its carries-in fit.
fn add_rule(addends: &[Prov], others: &[Prov], carries: &[Prov]) -> Option<(Prov, Prov)> {
    let bases: Vec<Prov> = addends
        .iter()
        .copied()
        .filter(|p| matches!(p, Prov::Lo(_) | Prov::Hi(_)))
        .collect();
    let [base] = bases[..] else { return None };
    let plain = |p: &Prov| *p == NO;
    let rest_plain = addends.iter().filter(|p| **p != base).all(plain)
        && addends.iter().filter(|p| **p == base).count() == 1
        && others.iter().all(plain);
    let (x, carry_ok) = match base {
        Prov::Lo(x) => (x, carries.iter().all(plain)),
        Prov::Hi(x) => (x, carries.iter().all(|c| plain(c) || *c == Prov::Carry(x))),
        _ => return None,
    };
    (rest_plain && carry_ok).then(|| {
        let carry_out = match base {
            Prov::Lo(_) => Prov::Carry(x),
            _ => Prov::May(1 << x),
        };
        (base, carry_out)
    })
}

fn is_imm_one(o: &Operand) -> bool {
    matches!(o, Operand::Imm(s) if s == "0x1" || s == "1")
}

/// What an instruction writes, `(location, provenance)`: strong destinations (overwritten) and
/// weak ones (joined with their old value).
struct Outputs {
    strong: Vec<(usize, Prov)>,
    weak: Vec<(usize, Prov)>,
}

/// The values an instruction writes.
fn outputs(step: &Step, rd: &Reader, sh: &Shared) -> Outputs {
    let insn = step.insn;
    let e = step.e;
    let ops = &insn.operands;
    let op = insn.op();
    let mods: Vec<&str> = insn.mods().collect();
    let srcs = operands_with(step, Role::Src);
    let preds_in = operands_with(step, Role::SrcPred);
    let dreg = operands_with(step, Role::DestReg).first().copied();
    let dreg_loc = dreg.and_then(|k| ops[k].as_reg()).and_then(|r| loc(r.reg));

    // May: every source, every constant-bank word, every memory cell it reads.
    let mut may = e.srcs.iter().fold(0, |s, &l| s | rd.loc(l).set());
    for o in ops {
        if matches!(o, Operand::CBank { .. }) {
            may |= rd.operand_set(o);
        }
    }
    let c = &sh.cells;
    // A read (or an atomic's old value) proven to be of public buffer X: what X holds. Put
    // there by the host before the launch, it derives from no pointer of this kernel (pointers
    // the host stores in memory are outside what this analysis proves; see the module notes);
    // once the kernel writes X, it may also be whatever those writes stored (X's own cell).
    let proven = global_read_operand(step).and_then(|o| address(o, rd).0);
    let public_read = proven.map(|x| {
        if sh.written >> x & 1 == 0 {
            0
        } else {
            c.buffers[x as usize]
        }
    });
    match step.class {
        Class::Load(Space::Global | Space::Generic)
        | Class::Atomic(Space::Global | Space::Generic)
            if public_read.is_some() =>
        {
            may = public_read.unwrap_or(0)
        }
        Class::Load(Space::Global) | Class::Atomic(Space::Global) => may = c.global,
        // Every register operand is taken as a destination, coordinates included.
        Class::Texture => may |= c.global,
        Class::Load(Space::Generic) | Class::Atomic(Space::Generic) => {
            may = c.global | c.shared | c.local
        }
        Class::Load(Space::Shared) | Class::Atomic(Space::Shared) => may = c.shared,
        Class::Load(Space::Local) => may = c.local,
        Class::Gmma => may |= c.shared,
        Class::BarrierResult => may |= c.barrier,
        Class::Collective | Class::Shuffle => {
            for &c in &sh.peers[step.role] {
                may |= e.srcs.iter().fold(0, |s, &l| s | sh.ever[c][l]);
            }
        }
        _ => {}
    }
    if e.external_call {
        may |= c.global | c.shared | c.local;
    }
    let generic = Prov::May(may);
    let mut strong: Vec<(usize, Prov)> = e.dests.iter().map(|&d| (d, generic)).collect();
    let weak: Vec<(usize, Prov)> = e.weak_dests.iter().map(|&d| (d, generic)).collect();
    let mut set = |l: usize, p: Prov| {
        for s in strong.iter_mut().filter(|s| s.0 == l) {
            s.1 = p;
        }
    };
    let val = |k: usize| rd.operand(&ops[k], 0);
    let Some(dl) = dreg_loc else {
        return Outputs { strong, weak };
    };
    let carry_outs: Vec<usize> = operands_with(step, Role::DestPred)
        .into_iter()
        .filter_map(|k| ops[k].as_reg().and_then(|r| loc(r.reg)))
        .collect();
    let carries: Vec<Prov> = preds_in.iter().map(|&k| val(k)).collect();
    let wide = matches!(op, "IMAD" | "UIMAD") && mods.contains(&"WIDE");
    let add = |addends: Vec<usize>, others: Vec<usize>| {
        add_rule(
            &addends.iter().map(|&k| val(k)).collect::<Vec<_>>(),
            &others.iter().map(|&k| val(k)).collect::<Vec<_>>(),
            &carries,
        )
    };
    // A register read in part (`R2.H1`, `R2.B3`) is not the pointer's word.
    let whole = super::bits::reg_suffixes(insn)
        .iter()
        .all(|v| v.iter().all(|m| m == "64"));
    let result: Option<(Prov, Prov)> = match (op, step.class) {
        _ if !whole => None,
        ("MOV" | "MOV32I" | "UMOV" | "R2UR", _) if srcs.len() == 1 => {
            let v = val(srcs[0]);
            Some((v, Prov::May(v.set())))
        }
        (_, Class::Load(Space::Constant)) if mods.iter().all(|m| *m == "64") => {
            if let Some(o @ Operand::CBank { .. }) = srcs.first().map(|&k| &ops[k]) {
                for (w, &d) in e.dests.iter().enumerate() {
                    set(d, rd.operand(o, w));
                }
            }
            return Outputs { strong, weak };
        }
        ("IMAD" | "UIMAD", _) if wide && srcs.len() == 3 && carries.is_empty() => {
            let (a, b, c3) = (val(srcs[0]), val(srcs[1]), &ops[srcs[2]]);
            let pair = (rd.operand(c3, 0), rd.operand(c3, 1));
            if let (Prov::Lo(x), Prov::Hi(y)) = pair {
                if x == y && a == NO && b == NO && carry_outs.is_empty() {
                    let hi = e.dests.iter().copied().find(|&d| d != dl);
                    set(dl, Prov::Lo(x));
                    if let Some(h) = hi {
                        set(h, Prov::Hi(x));
                    }
                }
            }
            return Outputs { strong, weak };
        }
        ("IMAD" | "UIMAD", _)
            if srcs.len() == 3
                && mods
                    .iter()
                    .all(|m| matches!(*m, "U32" | "X" | "MOV" | "IADD" | "SHL")) =>
        {
            let mut addends = vec![srcs[2]];
            if is_imm_one(&ops[srcs[1]]) {
                addends.push(srcs[0]);
            } else if is_imm_one(&ops[srcs[0]]) {
                addends.push(srcs[1]);
            }
            let others = srcs[..2]
                .iter()
                .copied()
                .filter(|k| !addends.contains(k))
                .collect();
            add(addends, others)
        }
        ("IADD3" | "UIADD3", _) if mods.iter().all(|m| *m == "X") => add(srcs.clone(), vec![]),
        ("VIADD" | "IADD" | "IADD32I", _) if mods.is_empty() || mods == ["X"] => {
            add(srcs.clone(), vec![])
        }
        ("LEA" | "ULEA" | "ISCADD", _)
            if srcs.len() >= 2 && mods.iter().all(|m| matches!(*m, "HI" | "X" | "SX32")) =>
        {
            let others = srcs.iter().copied().filter(|&k| k != srcs[1]).collect();
            add(vec![srcs[1]], others)
        }
        ("SEL" | "USEL", _) if srcs.len() == 2 && mods.is_empty() => {
            let v = val(srcs[0]).join(val(srcs[1]));
            Some((v, Prov::May(v.set())))
        }
        _ => None,
    };
    if let Some((v, carry)) = result {
        set(dl, v);
        for &p in &carry_outs {
            set(p, carry);
        }
    }
    Outputs { strong, weak }
}

/// `@!PT`: the instruction never runs (the effects' guard is `None` for it, as for `@PT`).
fn never_runs(insn: &Insn) -> bool {
    insn.guard.is_some_and(|g| g.reg == Reg::True && g.negated)
}

/// Applies one instruction to the state.
fn transfer(step: &Step, st: &mut State, sh: &Shared, slots: &Slots) {
    if never_runs(step.insn) {
        return;
    }
    let e = step.e;
    let guard = e.guard.map(|g| (g, e.guard_neg));
    let view = if e.cross_lane { None } else { guard };
    let Outputs { strong, weak } = outputs(step, &Reader { st, view, slots }, sh);
    for &(d, new) in &strong {
        match guard {
            Some((g, neg)) => {
                let other = st
                    .cond
                    .iter()
                    .find(|c| c.loc == d && c.guard == g && c.neg != neg)
                    .map(|c| c.val);
                st.v[d] = match other {
                    // Both polarities written: the value is one of the two.
                    Some(o) => o.join(new),
                    None => st.v[d].join(new),
                };
                st.cond
                    .retain(|c| c.loc != d || (c.guard == g && c.neg != neg));
                st.cond.push(Fact {
                    loc: d,
                    guard: g,
                    neg,
                    val: new,
                });
            }
            None => {
                st.v[d] = new;
                st.cond.retain(|c| c.loc != d);
            }
        }
    }
    for &(d, new) in &weak {
        st.v[d] = st.v[d].join(new);
        st.cond.retain(|c| c.loc != d);
    }
    for d in strong.iter().chain(weak.iter()).map(|x| x.0) {
        if (P_BASE..SMEM).contains(&d) {
            st.cond.retain(|c| c.guard != d);
        }
    }
}

/// The register locations of the global address of a read (`LDG`, `LD`, `LDGSTS`'s source).
fn global_read_operand<'a>(step: &Step<'a>) -> Option<&'a Operand> {
    let mems: Vec<&Operand> = step.insn.operands.iter().filter(|o| o.is_mem()).collect();
    match step.class {
        Class::Load(Space::Global | Space::Generic) => mems.first().copied(),
        // An atomic that returns the old value reads the cell too (a tile counter's ticket).
        Class::Atomic(Space::Global | Space::Generic)
            if operands_with(step, Role::DestReg)
                .first()
                .and_then(|&k| step.insn.operands[k].as_reg())
                .is_some_and(|r| loc(r.reg).is_some()) =>
        {
            mems.first().copied()
        }
        Class::AsyncToShared if step.insn.op() == "LDGSTS" => mems
            .iter()
            .copied()
            .find(|o| matches!(o, Operand::Mem { prefix, .. } if prefix == "desc")),
        _ => None,
    }
}

/// Which public pointer an address operand is proven to be based on; and every public pointer
/// it may derive from.
fn address(o: &Operand, rd: &Reader) -> (Option<u8>, u64) {
    let Operand::Mem { addr, .. } = o else {
        return (None, 0);
    };
    let mut may = 0;
    let mut base = None;
    let mut ok = true;
    let mut pairs = 0;
    for r in addr {
        let words: Vec<Prov> = (0..r.width.max(1))
            .map(|k| rd.operand(&Operand::Reg(r.clone()), k))
            .collect();
        may |= words.iter().fold(0, |s, p| s | p.set());
        // A 32-bit term beside the pair (`[R2.64+UR4]`): in case the hardware reads it as a
        // 64-bit one, its neighbour must derive from no public pointer either.
        let next = if r.width <= 1 {
            rd.operand(&Operand::Reg(r.clone()), 1)
        } else {
            NO
        };
        match words[..] {
            [Prov::Lo(x), Prov::Hi(y)] if x == y && !r.negated => {
                pairs += 1;
                base = Some(x);
            }
            _ if words.iter().all(|p| *p == NO) && next == NO => {}
            _ => ok = false,
        }
    }
    ((ok && pairs == 1).then_some(base).flatten(), may)
}

/// Whether instruction `step` may write global memory: the registers its address (or, for a
/// call to unseen code, its arguments) may come from.
fn write_locs(step: &Step) -> Option<Vec<usize>> {
    let insn = step.insn;
    if never_runs(insn) {
        return None;
    }
    let mem_locs = || -> Vec<usize> {
        insn.operands
            .iter()
            .flat_map(|o| mem_operand_locs(insn, o))
            .collect()
    };
    match step.class {
        Class::Store(Space::Global | Space::Generic)
        | Class::Atomic(Space::Global | Space::Generic)
        | Class::AsyncFromShared => Some(mem_locs()),
        // A tensor load (UTMALDG) and LDGSTS write shared memory only: their coordinates and
        // offsets may derive from metadata (a paged cache's TMA coordinates are block-table
        // entries) without writing it. A bulk copy (UBLKCP) may run either way: a write.
        Class::AsyncToShared if !matches!(insn.op(), "LDGSTS" | "UTMALDG") => Some(mem_locs()),
        Class::Texture => Some(step.e.srcs.clone()),
        _ if step.e.external_call => Some(step.e.srcs.clone()),
        _ => None,
    }
}

/// Data flowing into memory cells (stores, copies, reductions, calls): the new cells. What
/// reaches global memory also reaches the cell of every public buffer the write's address (or
/// a call's arguments) may derive from.
fn cell_writes(step: &Step, rd: &Reader, c: &mut Cells) {
    let insn = step.insn;
    if never_runs(insn) {
        return;
    }
    let global_before = c.global;
    let mut to_global = 0u64;
    // The values stored: source operands outside the brackets, as wide as the access.
    let width = mem_width(insn);
    let data = || -> u64 {
        let mut s = 0;
        for (k, o) in insn.operands.iter().enumerate() {
            if step.roles.get(k) != Some(&Role::Src) {
                continue;
            }
            s |= match o {
                Operand::Reg(r) => {
                    (0..r.width.max(width)).fold(0, |s, w| s | rd.operand(o, w).set())
                }
                _ => rd.operand_set(o),
            };
        }
        s
    };
    match step.class {
        Class::Store(sp) | Class::Atomic(sp) => {
            let d = data();
            match sp {
                Space::Global => to_global |= d,
                Space::Generic => {
                    to_global |= d;
                    c.shared |= d;
                    c.local |= d;
                }
                Space::Shared => c.shared |= d,
                Space::Local => c.local |= d,
                Space::Constant => {}
            }
        }
        // A bulk copy may run either way (`write_locs`): what shared memory holds may reach
        // a buffer its address derives from.
        Class::AsyncToShared => {
            c.shared |= c.global;
            to_global_buffers(step, rd, c, c.shared);
        }
        Class::AsyncFromShared => to_global |= c.shared,
        // A surface write: its register operands may be the data.
        Class::Texture => to_global_buffers(
            step,
            rd,
            c,
            step.e.srcs.iter().fold(0, |s, &l| s | rd.loc(l).set()),
        ),
        Class::Barrier if step.e.writes_barrier_result => {
            c.barrier |= step.e.srcs.iter().fold(0, |s, &l| s | rd.loc(l).set())
        }
        _ => {}
    }
    if step.e.external_call {
        let args = step.e.srcs.iter().fold(0, |s, &l| s | rd.loc(l).set());
        to_global |= args | c.local;
        c.shared |= args;
        c.local |= args;
    }
    c.global = global_before | to_global;
    to_global_buffers(step, rd, c, to_global);
}

/// Adds `data` to the cell of every public buffer that `step` may write (`write_locs`: its
/// address, or a call's arguments, may derive from the buffer's pointer).
fn to_global_buffers(step: &Step, rd: &Reader, c: &mut Cells, data: u64) {
    let Some(ls) = write_locs(step) else { return };
    let mut may = ls.iter().fold(0, |s, &l| s | rd.st.v[l].set());
    if step.e.external_call {
        may |= c.local;
    }
    for (x, cell) in c.buffers.iter_mut().enumerate() {
        if may >> x & 1 == 1 {
            *cell |= data;
        }
    }
}

/// What the provenance analysis found.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    /// Per instruction: the public buffer its global read is proven to read (whether or not
    /// the buffer is written; see [`Provenance::public_reads`]).
    pub reads: Vec<Option<u8>>,
    /// Per buffer: reads whose address may derive from its pointer but is not proven to be
    /// based on it (their values stay secret).
    pub unproven: Vec<Vec<usize>>,
    /// Per buffer: instructions that may write through its pointer.
    pub writes: Vec<Vec<usize>>,
    /// Per buffer: every write of it is proven to store public values at a public address
    /// (set by the caller from the taint analysis; false until then).
    pub writes_public: Vec<bool>,
}

impl Provenance {
    /// Whether buffer `x`'s reads are public: the kernel never writes it, or writes only public
    /// values at public addresses ([`Provenance::writes_public`]).
    pub fn readable(&self, x: usize) -> bool {
        self.writes[x].is_empty() || self.writes_public[x]
    }

    /// Indices of the instructions whose global read is of a public buffer that the kernel never
    /// writes, or writes only with public values: the reads whose values are not taint sources.
    pub fn public_reads(&self) -> Vec<usize> {
        self.reads
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.filter(|&x| self.readable(x as usize)).map(|_| i))
            .collect()
    }
}

/// Runs the provenance analysis of `sec` for the public pointers `slots`; `effects` are the
/// section's read/write sets ([`taint::section_effects`], which refuses what the rule table
/// does not know, so every instruction classifies here).
pub fn analyze(
    sec: &Section,
    cfg: &Cfg,
    effects: &[Effects],
    slots: &Slots,
) -> Result<Provenance, taint::Refused> {
    let n = sec.insns.len();
    let nbuf = slots.starts.len();
    let mut steps = Vec::with_capacity(n);
    for (i, (insn, e)) in sec.insns.iter().zip(effects).enumerate() {
        let (rule, roles) =
            table::classify(insn).map_err(|why| taint::Refused { index: i, why })?;
        steps.push(Step {
            insn,
            class: rule.class,
            roles,
            e,
            branch: guarded_branch(sec, insn, e),
            role: 0,
        });
    }
    // Warp-role classes: blocks with the same sides of every warp split.
    let warp_roles = super::roles::analyze(sec, cfg, effects);
    let mut class_sides: Vec<Vec<Option<bool>>> = Vec::new();
    let mut class_block: Vec<usize> = Vec::new();
    let mut class_of = vec![0usize; cfg.blocks.len()];
    for (b, c) in class_of.iter_mut().enumerate() {
        let sides = warp_roles.sides(b).to_vec();
        *c = match class_sides.iter().position(|x| *x == sides) {
            Some(k) => k,
            None => {
                class_sides.push(sides);
                class_block.push(b);
                class_sides.len() - 1
            }
        };
    }
    if class_sides.is_empty() {
        class_block.push(0);
        class_sides.push(Vec::new());
    }
    for (i, step) in steps.iter_mut().enumerate() {
        step.role = cfg.block_of.get(i).map_or(0, |&b| class_of[b]);
    }
    let peers: Vec<Vec<usize>> = (0..class_sides.len())
        .map(|a| {
            (0..class_sides.len())
                .filter(|&b| {
                    cfg.blocks.is_empty() || warp_roles.compatible(class_block[a], class_block[b])
                })
                .collect()
        })
        .collect();
    // Registers other lanes hand over (shuffle data, collective inputs): read flow-insensitively.
    let mut tracked: Vec<usize> = steps
        .iter()
        .filter(|s| s.e.cross_lane)
        .flat_map(|s| s.e.srcs.iter().copied())
        .collect();
    tracked.sort_unstable();
    tracked.dedup();
    // Buffers the kernel may write: none at first; a round that finds a write of one it assumed
    // unwritten is redone with it written (what a read of it gives: see `outputs`).
    let mut written = 0u64;
    loop {
        let out = rounds(&steps, cfg, slots, &tracked, &peers, written, n, nbuf);
        let now = (0..nbuf)
            .filter(|&x| !out.writes[x].is_empty())
            .fold(0u64, |s, x| s | 1 << x);
        if now & !written == 0 {
            return Ok(out);
        }
        written |= now;
    }
}

/// The fixed point and the findings of one assumption about which buffers are `written`.
#[allow(clippy::too_many_arguments)]
fn rounds(
    steps: &[Step],
    cfg: &Cfg,
    slots: &Slots,
    tracked: &[usize],
    peers: &[Vec<usize>],
    written: u64,
    n: usize,
    nbuf: usize,
) -> Provenance {
    let mut sh = Shared {
        cells: Cells::new(nbuf),
        ever: vec![vec![0; NLOC]; peers.len()],
        peers: peers.to_vec(),
        written,
    };
    let block_in = loop {
        let (block_in, next) = fixed_point(steps, cfg, &sh, slots, tracked);
        if next == sh {
            break block_in;
        }
        sh = next;
    };
    let mut out = Provenance {
        reads: vec![None; n],
        unproven: vec![Vec::new(); nbuf],
        writes: vec![Vec::new(); nbuf],
        writes_public: vec![false; nbuf],
    };
    for (b, blk) in cfg.blocks.iter().enumerate() {
        let Some(mut st) = block_in[b].clone() else {
            continue;
        };
        for (i, step) in steps.iter().enumerate().take(blk.end).skip(blk.start) {
            let e = step.e;
            let rd = Reader {
                st: &st,
                view: e.guard.map(|g| (g, e.guard_neg)),
                slots,
            };
            if let Some(o) = global_read_operand(step) {
                let (base, may) = address(o, &rd);
                out.reads[i] = base;
                for x in (0..nbuf).filter(|&x| may >> x & 1 == 1 && base != Some(x as u8)) {
                    out.unproven[x].push(i);
                }
            }
            if let Some(ls) = write_locs(step) {
                let mut may = ls.iter().fold(0, |s, &l| s | st.v[l].set());
                if e.external_call {
                    may |= sh.cells.local;
                }
                for x in (0..nbuf).filter(|&x| may >> x & 1 == 1) {
                    out.writes[x].push(i);
                }
            }
            transfer(step, &mut st, &sh, slots);
        }
    }
    out
}

fn fixed_point(
    steps: &[Step],
    cfg: &Cfg,
    sh: &Shared,
    slots: &Slots,
    tracked: &[usize],
) -> (Vec<Option<State>>, Shared) {
    let nb = cfg.blocks.len();
    let mut block_in: Vec<Option<State>> = vec![None; nb];
    let mut next = sh.clone();
    if nb == 0 {
        return (block_in, next);
    }
    let entry = cfg.block_of[0];
    block_in[entry] = Some(State::entry());
    let mut work: std::collections::VecDeque<usize> = [entry].into();
    let mut queued = vec![false; nb];
    queued[entry] = true;
    let mut visits = vec![0u32; nb];
    while let Some(b) = work.pop_front() {
        queued[b] = false;
        visits[b] += 1;
        if visits[b] > 200 {
            // Termination safety net, as in the taint analysis: drop the guarded facts.
            if let Some(st) = block_in[b].as_mut() {
                st.cond.clear();
            }
        }
        let mut s = block_in[b].clone().expect("queued blocks have a state");
        let blk = &cfg.blocks[b];
        for step in &steps[blk.start..blk.end] {
            let e = step.e;
            let rd = Reader {
                st: &s,
                view: e.guard.map(|g| (g, e.guard_neg)),
                slots,
            };
            cell_writes(step, &rd, &mut next.cells);
            transfer(step, &mut s, sh, slots);
            for &l in tracked {
                next.ever[step.role][l] |= s.v[l].set();
            }
        }
        // A guarded branch is taken exactly when its guard holds, and falls through when not.
        let edge = |succ: usize| -> Option<(usize, bool)> {
            let (g, neg, target) = steps[blk.end - 1].branch?;
            let taken = cfg.block_of[target];
            let fall = cfg.block_of.get(blk.end).copied();
            if taken == succ && fall != Some(succ) {
                Some((g, neg))
            } else if fall == Some(succ) && taken != succ {
                Some((g, !neg))
            } else {
                None
            }
        };
        for &succ in &blk.succs {
            let mut out = s.clone();
            if let Some((g, neg)) = edge(succ) {
                assume(&mut out, g, neg);
            }
            let changed = match &mut block_in[succ] {
                Some(d) => join_into(d, &out),
                slot @ None => {
                    *slot = Some(out);
                    true
                }
            };
            if changed && !queued[succ] {
                queued[succ] = true;
                work.push_back(succ);
            }
        }
    }
    (block_in, next)
}

#[cfg(test)]
mod tests {
    use super::super::{cfg, sass, taint::Secrets};
    use super::*;
    use Prov::{Carry, Hi, Lo, May};

    fn section(body: &str) -> Section {
        let listing =
            format!("\t.section\t.text.k,\"ax\",@progbits\n        .type k,@function\nk:\n{body}");
        sass::parse_listing(&listing).remove(0)
    }

    /// Public pointers at c[0x0][0x210] (buffer 0) and c[0x0][0x220] (buffer 1); 0x218 is K.
    fn slots() -> Slots {
        Slots {
            starts: vec![0x210, 0x220],
        }
    }

    /// Straight-line `body` from the entry state: the provenance of every location after it.
    fn after(body: &str) -> Vec<Prov> {
        let sec = section(body);
        let effects = taint::section_effects(&sec, &Secrets::default()).unwrap();
        let sh = Shared {
            cells: Cells::default(),
            ever: vec![vec![0; NLOC]],
            peers: vec![vec![0]],
            written: 0,
        };
        let mut st = State::entry();
        for (insn, e) in sec.insns.iter().zip(&effects) {
            let (rule, roles) = table::classify(insn).unwrap();
            let step = Step {
                insn,
                class: rule.class,
                roles,
                e,
                branch: None,
                role: 0,
            };
            transfer(&step, &mut st, &sh, &slots());
        }
        st.v
    }

    fn run(body: &str) -> Provenance {
        let sec = section(body);
        let g = cfg::build(&sec);
        let effects = taint::section_effects(&sec, &Secrets::default()).unwrap();
        analyze(&sec, &g, &effects, &slots()).unwrap()
    }

    /// A warp-specialised kernel: warps 0–3 (`threadIdx.x < 128`) hold buffer 0's pointer in
    /// R8:R9; the other warps shuffle R9 and store through an address made from what they got.
    /// Only lanes of the reader's warp reach its shuffle, and none of them ever runs the other
    /// side: no write of buffer 0. The same split on a thread index that does not cut between
    /// warps (16), or on a register that may not be the thread index, is no warp split: the
    /// shuffle may read the pointer, and the store is a write of buffer 0.
    #[test]
    fn a_warp_split_keeps_one_sides_registers_from_the_others_shuffles() {
        let body = |split: &str| {
            format!(
                "/*0000*/ S2R R0, SR_TID.X ;\n\
                 {split}\n\
                 /*0020*/ @P0 BRA `(.L_x_1) ;\n\
                 /*0030*/ LDC.64 R8, c[0x0][0x210] ;\n\
                 /*0040*/ LDG.E R6, desc[UR4][R8.64] ;\n\
                 /*0050*/ EXIT ;\n\
.L_x_1:\n\
                 /*0060*/ LDC.64 R2, c[0x0][0x218] ;\n\
                 /*0070*/ MOV R9, RZ ;\n\
                 /*0080*/ SHFL.BFLY PT, R10, R9, 0x1, 0x1f ;\n\
                 /*0090*/ IMAD.WIDE R4, R10, 0x4, R2 ;\n\
                 /*00a0*/ STG.E desc[UR4][R4.64], RZ ;\n\
                 /*00b0*/ EXIT ;\n"
            )
        };
        let warps = run(&body("/*0010*/ ISETP.GE.U32.AND P0, PT, R0, 0x80, PT ;"));
        assert!(warps.writes[0].is_empty(), "{:?}", warps.writes[0]);
        assert_eq!(warps.reads[4], Some(0));
        let below = run(&body("/*0010*/ ISETP.GT.AND P0, PT, R0, 0x7f, PT ;"));
        assert!(below.writes[0].is_empty(), "GT 127 cuts between warps too");
        let lanes = run(&body("/*0010*/ ISETP.GE.U32.AND P0, PT, R0, 0x10, PT ;"));
        assert_eq!(
            lanes.writes[0],
            vec![10],
            "lanes 0–15 and 16–31 share a warp"
        );
        let moved = run(&body(
            "/*0008*/ IADD3 R0, R0, 0x10, RZ ;\n/*0010*/ ISETP.GE.U32.AND P0, PT, R0, 0x80, PT ;",
        ));
        assert_eq!(
            moved.writes[0],
            vec![11],
            "R0 is no longer the thread index"
        );
    }

    /// A read proven to be of a public buffer the kernel never writes gives a value that derives
    /// from no pointer, even when memory holds one (here the buffer's own pointer, stored into
    /// K's memory): an address made from it is no write of the buffer. Once the kernel writes
    /// the buffer, the read gives what is written through the buffer's pointer: a zero leaves it
    /// derived from no pointer, the pointer itself makes it the pointer again.
    #[test]
    fn reads_of_an_unwritten_public_buffer_derive_from_no_pointer() {
        let body = |extra: &str| {
            format!(
                "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
                 /*0010*/ LDC.64 R4, c[0x0][0x218] ;\n\
                 /*0020*/ STG.E.64 desc[UR4][R4.64], R2 ;\n\
                 {extra}\n\
                 /*0030*/ LDG.E R6, desc[UR4][R2.64] ;\n\
                 /*0040*/ IMAD.WIDE R8, R6, 0x4, R4 ;\n\
                 /*0050*/ STG.E desc[UR4][R8.64], RZ ;\n\
                 /*0060*/ EXIT ;\n"
            )
        };
        let clean = run(&body(""));
        assert_eq!(clean.reads[3], Some(0));
        assert!(clean.writes[0].is_empty(), "{:?}", clean.writes[0]);
        let written = run(&body("/*0028*/ STG.E desc[UR4][R2.64], RZ ;"));
        assert_eq!(written.writes[0], vec![3]);
        let pointer = run(&body("/*0028*/ STG.E desc[UR4][R2.64+0x8], R2 ;"));
        assert_eq!(pointer.writes[0], vec![3, 6]);
    }

    /// The forward kernel's tile counter: a ticket is an atomic's old value (a read of the
    /// buffer, which the atomic writes), and a tile's address is built from it. A shuffle of a
    /// register that holds the counter's pointer elsewhere puts a value derived from it into
    /// K's memory (as an output written from a shuffle does); the ticket, reading only what is
    /// written through the counter's pointer, stays derived from no pointer, and the tile's
    /// store is no write of the counter. The same value stored through the counter's pointer
    /// reaches the ticket, and the tile's store may write the counter.
    #[test]
    fn a_ticket_reads_only_what_is_written_through_its_buffer() {
        let body = |to: &str| {
            format!(
                "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
                 /*0010*/ LDC.64 R4, c[0x0][0x218] ;\n\
                 /*0020*/ SHFL.BFLY PT, R6, R3, 0x1, 0x1f ;\n\
                 /*0030*/ STG.E desc[UR4][{to}], R6 ;\n\
                 /*0040*/ ATOMG.E.INC.STRONG.GPU PT, R7, desc[UR4][R2.64], R8 ;\n\
                 /*0050*/ IMAD.WIDE R10, R7, 0x4, R4 ;\n\
                 /*0060*/ STG.E desc[UR4][R10.64], RZ ;\n\
                 /*0070*/ EXIT ;\n"
            )
        };
        let elsewhere = run(&body("R4.64"));
        assert_eq!(elsewhere.reads[4], Some(0), "the ticket reads the counter");
        assert_eq!(elsewhere.writes[0], vec![4], "the increment only");
        let inside = run(&body("R2.64+0x8"));
        assert_eq!(inside.writes[0], vec![3, 4, 6]);
    }

    fn r(i: usize) -> usize {
        taint::R_BASE + i
    }
    fn ur(i: usize) -> usize {
        taint::UR_BASE + i
    }
    fn p(i: usize) -> usize {
        P_BASE + i
    }

    #[test]
    fn pointer_words_come_from_the_constant_bank() {
        let v = after(
            "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ ULDC.64 UR8, c[0x0][0x220] ;\n\
             /*0020*/ LDC R4, c[0x0][0x214] ;\n\
             /*0030*/ LDC.64 R6, c[0x0][0x218] ;\n\
             /*0040*/ LDC R8, c[0x0][RZ] ;\n\
             /*0050*/ LDC R9, c[0x0][R0+0x200] ;\n\
             /*0060*/ LDC.U8 R10, c[0x0][0x211] ;\n\
             /*0070*/ LDC.64 R12, c[0x3][0x210] ;\n",
        );
        assert_eq!((v[r(2)], v[r(3)]), (Lo(0), Hi(0)));
        assert_eq!((v[ur(8)], v[ur(9)]), (Lo(1), Hi(1)));
        assert_eq!(v[r(4)], Hi(0), "one word of the pointer");
        assert_eq!((v[r(6)], v[r(7)]), (NO, NO), "K's pointer is not public");
        assert_eq!(v[r(8)], NO, "c[0x0][RZ] is not indexed");
        assert_eq!(
            v[r(9)],
            May(3),
            "a register-indexed read may read any pointer"
        );
        assert_eq!(v[r(10)], May(1), "a byte of the pointer is no pointer");
        assert_eq!((v[r(12)], v[r(13)]), (NO, NO), "another bank");
    }

    #[test]
    fn base_plus_public_offset_keeps_the_pointer() {
        let v = after(
            "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ ULDC.64 UR8, c[0x0][0x210] ;\n\
             /*0020*/ S2R R0, SR_TID.X ;\n\
             /*0030*/ IMAD.WIDE R4, R0, 0x4, R2 ;\n\
             /*0040*/ IMAD.WIDE.U32 R6, R0, 0x4, c[0x0][0x210] ;\n\
             /*0050*/ LEA R8, P0, R0, UR8, 0x2 ;\n\
             /*0060*/ LEA.HI.X R9, R0, UR9, RZ, 0x2, P0 ;\n\
             /*0070*/ IADD3 R10, P1, R0, R2, RZ ;\n\
             /*0080*/ IADD3.X R11, RZ, R3, RZ, P1, !PT ;\n\
             /*0090*/ IADD3 R12, P2, R2, 0x10, RZ ;\n\
             /*00a0*/ IMAD.X R13, RZ, RZ, R3, P2 ;\n\
             /*00b0*/ MOV R14, R2 ;\n\
             /*00c0*/ IMAD.MOV.U32 R15, RZ, RZ, R3 ;\n\
             /*00d0*/ R2UR UR10, R2 ;\n\
             /*00e0*/ UMOV UR11, UR9 ;\n\
             /*00f0*/ VIADD R16, R2, 0x20 ;\n\
             /*0100*/ IMAD.IADD R17, R0, 0x1, R2 ;\n\
             /*0110*/ UIADD3 UR12, UP0, UR8, 0x20, URZ ;\n\
             /*0120*/ UIADD3.X UR13, URZ, UR9, URZ, UP0, !UPT ;\n\
             /*0130*/ LEA.HI.X.SX32 R19, R0, R3, 0x1, P0 ;\n\
             /*0140*/ SEL R20, R4, R2, P3 ;\n\
             /*0150*/ IMAD R21, R0, 0x8, R2 ;\n",
        );
        let pair = |a: usize| (v[a], v[a + 1]);
        assert_eq!(pair(r(4)), (Lo(0), Hi(0)), "IMAD.WIDE");
        assert_eq!(
            pair(r(6)),
            (Lo(0), Hi(0)),
            "IMAD.WIDE of a constant-bank pair"
        );
        assert_eq!(pair(r(8)), (Lo(0), Hi(0)), "LEA / LEA.HI.X");
        assert_eq!(v[p(0)], Carry(0));
        assert_eq!(pair(r(10)), (Lo(0), Hi(0)), "IADD3 / IADD3.X");
        assert_eq!(pair(r(12)), (Lo(0), Hi(0)), "IADD3 / IMAD.X");
        assert_eq!(pair(r(14)), (Lo(0), Hi(0)), "MOV / IMAD.MOV");
        assert_eq!(pair(ur(10)), (Lo(0), Hi(0)), "R2UR / UMOV");
        assert_eq!((v[r(16)], v[r(17)]), (Lo(0), Lo(0)), "VIADD / IMAD.IADD");
        assert_eq!(pair(ur(12)), (Lo(0), Hi(0)), "UIADD3 pair");
        assert_eq!(v[r(19)], Hi(0), "LEA.HI.X.SX32");
        assert_eq!(v[r(20)], Lo(0), "a select of two offsets from one pointer");
        assert_eq!(v[r(21)], Lo(0), "IMAD with the pointer as addend");
    }

    #[test]
    fn other_derivations_are_not_the_pointer() {
        let v = after(
            "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ LDC.64 R4, c[0x0][0x220] ;\n\
             /*0020*/ LDC.64 R6, c[0x0][0x218] ;\n\
             /*0030*/ S2R R0, SR_TID.X ;\n\
             /*0040*/ IMAD.SHL.U32 R8, R2, 0x4, RZ ;\n\
             /*0050*/ IADD3 R9, -R2, R0, RZ ;\n\
             /*0060*/ IADD3 R10, R2, R2, RZ ;\n\
             /*0070*/ IADD3 R11, R2, R4, RZ ;\n\
             /*0080*/ LOP3.LUT R12, R2, 0xfffffff0, RZ, 0xc0, !PT ;\n\
             /*0090*/ SHF.L.U64.HI R13, R2, 0x2, R3 ;\n\
             /*00a0*/ IADD3 R14, R2, R9, RZ ;\n\
             /*00b0*/ SEL R15, R2, R6, P0 ;\n\
             /*00c0*/ SEL R16, R2, R4, P0 ;\n\
             /*00d0*/ IADD3 R17, P1, R4, R0, RZ ;\n\
             /*00e0*/ IADD3.X R18, R3, RZ, RZ, P1, !PT ;\n\
             /*00f0*/ IMAD.HI.U32 R19, R0, 0x4, R2 ;\n\
             /*0100*/ IMAD.WIDE R20, R2, 0x4, RZ ;\n\
             /*0110*/ IADD3.X R22, R2, RZ, RZ, P1, !PT ;\n\
             /*0120*/ ISETP.NE.U32.AND P2, PT, R2, RZ, PT ;\n\
             /*0130*/ IMAD.U32 R23, RZ, RZ, R2.H1 ;\n\
             /*0140*/ R2UR P3, UR20, R2 ;\n",
        );
        assert_eq!(v[r(8)], May(1), "a multiple of the pointer");
        assert_eq!(v[r(9)], May(1), "minus the pointer");
        assert_eq!(v[r(10)], May(1), "the pointer twice");
        assert_eq!(v[r(11)], May(3), "two pointers");
        assert_eq!(v[r(12)], May(1), "logic on the pointer");
        assert_eq!(v[r(13)], May(1), "a 64-bit shift");
        assert_eq!(v[r(14)], May(1), "an offset that derives from the pointer");
        assert_eq!(
            v[r(15)],
            May(1),
            "public pointer on one side, K on the other"
        );
        assert_eq!(v[r(16)], May(3), "two public pointers");
        assert_eq!(
            v[r(18)],
            May(3),
            "the high word with another pointer's carry"
        );
        assert_eq!(v[r(19)], May(1), "IMAD.HI");
        assert_eq!(
            (v[r(20)], v[r(21)]),
            (May(1), May(1)),
            "the pointer multiplied"
        );
        assert_eq!(
            v[r(22)],
            May(3),
            "a low word with (another pointer's) carry-in"
        );
        assert_eq!(v[p(2)], May(1), "a comparison of the pointer");
        assert_eq!(v[r(23)], May(1), "half a word of the pointer");
        assert_eq!((v[ur(20)], v[p(3)]), (Lo(0), May(1)), "R2UR's predicate");
    }

    #[test]
    fn an_instruction_under_not_pt_never_runs() {
        let v = after(
            "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ @!PT LDC.64 R2, c[0x0][0x218] ;\n\
             /*0020*/ @PT MOV R4, R2 ;\n",
        );
        assert_eq!((v[r(2)], v[r(3)], v[r(4)]), (Lo(0), Hi(0), Lo(0)));
    }

    #[test]
    fn an_atomic_on_the_buffer_reads_it() {
        let pr = run("/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ ATOMG.E.ADD.STRONG.GPU PT, R3, desc[UR6][R2.64], R5 ;\n\
             /*0020*/ LDC.64 R4, c[0x0][0x210] ;\n\
             /*0030*/ ATOMG.E.EXCH.STRONG.GPU PT, RZ, desc[UR6][R4.64], RZ ;\n\
             /*0040*/ EXIT ;\n");
        assert_eq!(pr.reads[1], Some(0), "a ticket: the atomic's old value");
        assert_eq!(pr.reads[3], None, "no value returned: a write only");
        assert_eq!(pr.writes[0], vec![1, 3]);
        let pr = run("/*0000*/ S2R R7, SR_LANEID ;\n\
             /*0010*/ VOTEU.ANY UR4, UPT, PT ;\n\
             /*0020*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0030*/ FLO.U32 R4, UR4 ;\n\
             /*0040*/ POPC R5, UR4 ;\n\
             /*0050*/ ISETP.EQ.U32.AND P1, PT, R4, R7, PT ;\n\
             /*0060*/ @P1 ATOMG.E.ADD.STRONG.GPU PT, R3, desc[UR6][R2.64], R5 ;\n\
             /*0070*/ EXIT ;\n");
        assert_eq!(pr.reads[6], Some(0), "under a guard, warp-aggregated");
        let pr = run("/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ UIADD3 UR8, UP0, UR6, 0x280b0, URZ ;\n\
             /*0020*/ IMAD.MOV.U32 R4, RZ, RZ, 0x1 ;\n\
             /*0030*/ IMAD.MOV.U32 R5, RZ, RZ, 0x7fffffff ;\n\
             /*0040*/ ATOMG.E.INC.STRONG.GPU PT, R0, desc[UR26][R2.64], R5 ;\n\
             /*0050*/ EXIT ;\n");
        assert_eq!(pr.reads[4], Some(0), "an increment");
    }

    #[test]
    fn guarded_writes_join_and_are_seen_under_their_guard() {
        let v = after(
            "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ S2R R0, SR_TID.X ;\n\
             /*0020*/ ISETP.GE.AND P0, PT, R0, 0x3, PT ;\n\
             /*0030*/ @P0 LDC R2, c[0x0][0x218] ;\n\
             /*0040*/ @P0 LDC R3, c[0x0][0x21c] ;\n\
             /*0050*/ MOV R4, R2 ;\n\
             /*0060*/ @!P0 MOV R5, R2 ;\n\
             /*0070*/ @P0 MOV R6, R3 ;\n\
             /*0080*/ @P0 MOV R7, R2 ;\n\
             /*0090*/ @!P0 MOV R7, R2 ;\n",
        );
        assert_eq!(v[r(4)], May(1), "bt on one lane, K on another");
        let sec_v = after(
            "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ S2R R0, SR_TID.X ;\n\
             /*0020*/ ISETP.GE.AND P0, PT, R0, 0x3, PT ;\n\
             /*0030*/ @P0 IMAD.WIDE R8, R0, 0x4, R2 ;\n\
             /*0040*/ @P0 MOV R10, R8 ;\n",
        );
        assert_eq!(sec_v[r(8)], May(1), "plain: written or not");
        assert_eq!(sec_v[r(10)], May(1), "plain join under the guard too");
        // The fact under the guard: a load under P0 reads bt.
        let pr = run("/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ S2R R0, SR_TID.X ;\n\
             /*0020*/ ISETP.GE.AND P0, PT, R0, 0x3, PT ;\n\
             /*0030*/ @P0 IMAD.WIDE R8, R0, 0x4, R2 ;\n\
             /*0040*/ @P0 LDG.E R4, desc[UR4][R8.64] ;\n\
             /*0050*/ @!P0 LDG.E R5, desc[UR4][R8.64] ;\n\
             /*0060*/ LDG.E R6, desc[UR4][R8.64] ;\n\
             /*0070*/ EXIT ;\n");
        assert_eq!(pr.reads[4], Some(0), "under the guard it was written under");
        assert_eq!(
            pr.reads[5], None,
            "under the other polarity it is the old value"
        );
        assert_eq!(pr.reads[6], None, "unguarded: written or not");
        assert_eq!(pr.unproven[0], vec![5, 6]);
        assert!(pr.writes[0].is_empty());
        assert_eq!(pr.public_reads(), vec![4]);
    }

    #[test]
    fn merges_keep_only_what_every_path_agrees_on() {
        let body = |other: &str| {
            format!(
                "/*0000*/ S2R R0, SR_TID.X ;\n\
                 /*0010*/ ISETP.GE.AND P0, PT, R0, 0x10, PT ;\n\
                 /*0020*/ @P0 BRA `(.L_x_1) ;\n\
                 /*0030*/ LDC.64 R2, c[0x0][0x210] ;\n\
                 /*0040*/ BRA `(.L_x_2) ;\n\
.L_x_1:\n\
                 /*0050*/ LDC.64 R2, c[0x0][{other}] ;\n\
                 /*0060*/ IADD3 R2, P1, R2, 0x40, RZ ;\n\
                 /*0070*/ IADD3.X R3, RZ, R3, RZ, P1, !PT ;\n\
.L_x_2:\n\
                 /*0080*/ IMAD.WIDE R4, R0, 0x4, R2 ;\n\
                 /*0090*/ LDG.E R6, desc[UR4][R4.64] ;\n\
                 /*00a0*/ EXIT ;\n"
            )
        };
        let same = run(&body("0x210"));
        assert_eq!(
            same.reads[9],
            Some(0),
            "bt on both paths (different offsets)"
        );
        let mixed = run(&body("0x218"));
        assert_eq!(mixed.reads[9], None, "bt on one path, K on the other");
        assert_eq!(mixed.unproven[0], vec![9]);
        let two = run(&body("0x220"));
        assert_eq!(two.reads[9], None, "two public buffers: neither");
        assert_eq!(
            (two.unproven[0].clone(), two.unproven[1].clone()),
            (vec![9], vec![9])
        );
    }

    #[test]
    fn a_guarded_branch_knows_its_guard_on_each_edge() {
        // `@P0 MOV R4, RZ; @P0 BRA` (zero and skip): on the taken edge R4 is 0, not bt's word.
        let pr = run("/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ LDC.64 R4, c[0x0][0x210] ;\n\
             /*0020*/ S2R R0, SR_TID.X ;\n\
             /*0030*/ ISETP.GE.AND P0, PT, R0, 0x10, PT ;\n\
             /*0040*/ @P0 IMAD.MOV.U32 R4, RZ, RZ, RZ ;\n\
             /*0050*/ @P0 BRA `(.L_x_1) ;\n\
             /*0060*/ MOV R4, R0 ;\n\
.L_x_1:\n\
             /*0070*/ STG.E desc[UR6][R2.64+0x100], R4 ;\n\
             /*0080*/ LDG.E R6, desc[UR6][R2.64] ;\n\
             /*0090*/ EXIT ;\n");
        assert!(pr.writes[0].contains(&7), "a store through bt is a write");
        // The value stored is no pointer: global memory holds none, the load's value neither.
        let v_ok = run("/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ LDC.64 R4, c[0x0][0x210] ;\n\
             /*0020*/ LDC.64 R8, c[0x0][0x228] ;\n\
             /*0030*/ S2R R0, SR_TID.X ;\n\
             /*0040*/ ISETP.GE.AND P0, PT, R0, 0x10, PT ;\n\
             /*0050*/ @P0 IMAD.MOV.U32 R4, RZ, RZ, RZ ;\n\
             /*0060*/ @P0 BRA `(.L_x_1) ;\n\
             /*0070*/ MOV R4, R0 ;\n\
.L_x_1:\n\
             /*0080*/ STG.E desc[UR6][R8.64], R4 ;\n\
             /*0090*/ LDG.E R6, desc[UR6][R8.64] ;\n\
             /*00a0*/ IADD3 R10, P1, R6, R2, RZ ;\n\
             /*00b0*/ IADD3.X R11, RZ, R3, RZ, P1, !PT ;\n\
             /*00c0*/ LDG.E R12, desc[UR6][R10.64] ;\n\
             /*00d0*/ EXIT ;\n");
        assert!(v_ok.writes[0].is_empty(), "{v_ok:?}");
        assert_eq!(
            v_ok.reads[12],
            Some(0),
            "an offset loaded from memory is no pointer"
        );
    }

    #[test]
    fn writes_through_the_pointer_or_its_copies_demote_the_buffer() {
        for (what, body) in [
            ("store", "/*0030*/ STG.E desc[UR6][R4.64], R0 ;\n"),
            (
                "atomic",
                "/*0030*/ RED.E.ADD.STRONG.GPU desc[UR6][R4.64], R0 ;\n",
            ),
            (
                "spilled and reloaded",
                "/*0030*/ STL.64 [R1], R4 ;\n\
                 /*0040*/ LDL.64 R8, [R1] ;\n\
                 /*0050*/ ST.E desc[UR6][R8.64], R0 ;\n",
            ),
            (
                "through global memory",
                "/*0030*/ STG.E.64 desc[UR6][R12.64], R4 ;\n\
                 /*0040*/ LDG.E.64 R8, desc[UR6][R12.64] ;\n\
                 /*0050*/ STG.E desc[UR6][R8.64], R0 ;\n",
            ),
            (
                "shuffled",
                "/*0030*/ SHFL.IDX PT, R8, R4, RZ, 0x1f ;\n\
                 /*0040*/ SHFL.IDX PT, R9, R5, RZ, 0x1f ;\n\
                 /*0050*/ STG.E desc[UR6][R8.64], R0 ;\n",
            ),
            (
                "passed to unseen code",
                "/*0030*/ MOV R6, R4 ;\n\
                 /*0040*/ CALL.ABS.NOINC R10 ;\n",
            ),
        ] {
            let pr = run(&format!(
                "/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
                 /*0010*/ S2R R0, SR_TID.X ;\n\
                 /*0020*/ IMAD.WIDE R4, R0, 0x4, R2 ;\n\
                 /*0028*/ LDG.E R7, desc[UR6][R2.64] ;\n\
                 {body}\
                 /*0110*/ EXIT ;\n"
            ));
            assert!(!pr.writes[0].is_empty(), "{what}: {pr:?}");
            assert_eq!(pr.reads[3], Some(0), "{what}");
            assert!(
                pr.public_reads().is_empty(),
                "{what}: the buffer is written"
            );
            assert!(pr.writes[1].is_empty(), "{what}");
        }
    }

    #[test]
    fn address_forms() {
        let pr = run("/*0000*/ LDC.64 R2, c[0x0][0x210] ;\n\
             /*0010*/ ULDC.64 UR8, c[0x0][0x210] ;\n\
             /*0020*/ S2R R0, SR_TID.X ;\n\
             /*0030*/ LDG.E.128.CONSTANT R4, desc[UR6][R2.64+0x40] ;\n\
             /*0040*/ LDG.E R4, desc[UR6][R2.64+UR10] ;\n\
             /*0050*/ LD.E R4, desc[UR6][UR8.64] ;\n\
             /*0060*/ LDG.E R4, desc[UR6][R2.64+UR8] ;\n\
             /*0070*/ LDGSTS.E [R0], desc[UR6][R2.64] ;\n\
             /*0080*/ LDG.E R4, desc[UR6][R3.64] ;\n\
             /*0090*/ LD.E R4, [R2] ;\n\
             /*00a0*/ ULDC.64 UR20, c[0x0][0x220] ;\n\
             /*00b0*/ LDG.E R4, desc[UR6][R2.64+UR19] ;\n\
             /*00c0*/ EXIT ;\n");
        assert_eq!(pr.reads[3], Some(0), "vector load, immediate offset");
        assert_eq!(pr.reads[4], Some(0), "a uniform register offset");
        assert_eq!(pr.reads[5], Some(0), "generic load, uniform pair");
        assert_eq!(pr.reads[6], None, "the pointer as both base and offset");
        assert_eq!(pr.reads[7], Some(0), "LDGSTS's global source");
        assert_eq!(pr.reads[8], None, "a misaligned pair");
        assert_eq!(pr.reads[9], None, "a 32-bit address");
        assert_eq!(
            pr.reads[11], None,
            "a uniform term whose neighbour is a pointer word"
        );
    }
}
