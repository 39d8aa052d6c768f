//! The rule table: one entry for every opcode `nvdisasm` prints for sm_90a (the Hopper
//! instruction set of NVIDIA's "CUDA Binary Utilities", plus the few opcodes nvdisasm prints that
//! the list omits: `F2FP`, `RED`, `ARRIVES`). Each entry names the opcode's taint class (how
//! taint moves from its sources to its destinations, registers, predicates, carries, uniform
//! registers and memory cells alike) and the operand forms it may take. The audit refuses
//! (exit 2, naming the instruction) any opcode that is not in the table and any operand list
//! that matches none of its forms: an instruction the analysis does not understand is never
//! silently called clean.
//!
//! # Operand forms
//!
//! A form is a list of slots, one per operand, in order:
//!
//! | slot | matches | role |
//! |---|---|---|
//! | `d` | `R`, `RZ`, `UR`, `URZ` | destination register (with its width) |
//! | `q` | `P`, `PT`, `UP`, `UPT` | destination predicate (carry-outs included) |
//! | `s` | register, immediate or constant-bank word | source value |
//! | `b` | `P`, `PT`, `UP`, `UPT` (maybe negated) | source predicate (carry-ins included) |
//! | `m` | `[..]`, `desc[..][..]`, `gdesc[..]` | memory operand (its registers are sources) |
//! | `l` | `` `(label) `` | code target |
//! | `x` | anything else: `SR_TID.X`, `B0`, `gsb0`, `SB0` | named constant, public |
//! | `R` | `PR`, `UPR` | all predicates (P2R/R2P/UP2UR/UR2UP) |
//!
//! A slot may end in `?` (zero or one) or `*` (any number). Forms are tried in order; the first
//! that matches the whole operand list decides which operands are destinations.

use super::sass::{Insn, Operand, Reg};

/// Version of the rule table; recorded in `--json` output so CI knows what was checked. Bump it
/// whenever an entry, a form or a class changes.
pub const VERSION: &str = "sm90a-2026.11.22-1";

/// Memory space of a load, store or atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Space {
    /// Global memory: every byte may be secret.
    Global,
    /// Generic address: may be global or shared.
    Generic,
    /// Shared memory (one cell for the whole CTA, flow-insensitive).
    Shared,
    /// Local memory (per thread: spills).
    Local,
    /// Constant banks (kernel parameters, `__constant__`).
    Constant,
}

/// How taint moves through an instruction, and which of its operands are sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// Arithmetic, logic, conversion, move, compare, select: every source (registers,
    /// predicates, carry-in, constant-bank words) flows to every destination (registers,
    /// predicates, carry-out). Bit-precise transfers refine this for LOP3/SHF/LEA/... .
    Alu,
    /// Like [`Class::Alu`], and a variable-latency sink when the slow path follows (`MUFU`
    /// RCP/RSQ/SQRT, `FCHK`).
    AluLatency,
    /// Warp-collective (`VOTE`, `VOTEU`, `MATCH`, `REDUX`, `ELECT`): the result combines the
    /// inputs of every participating lane, so it is secret when any lane's input may be; its
    /// guard (the member mask) is a control-flow sink.
    Collective,
    /// `SHFL`: a collective whose data may come from a lane that is not at this instruction
    /// (an inactive source lane gives an undefined value, in practice that lane's register):
    /// the data source is read flow-insensitively (secret anywhere ⇒ secret here); the lane
    /// index and clamp flow to the result too.
    Shuffle,
    /// Load from memory: the loaded value takes the memory's taint and the address's.
    Load(Space),
    /// Store: the data flows into the memory cell; address and guard are sinks.
    Store(Space),
    /// Atomic / reduction: load and store at once (the returned value is secret when the
    /// memory may be).
    Atomic(Space),
    /// Asynchronous copy into shared memory (`LDGSTS`, `UTMALDG`, `UBLKCP`): shared memory
    /// becomes secret; addresses, descriptors, coordinates and the guard are sinks.
    AsyncToShared,
    /// Asynchronous copy out of shared memory (`UTMASTG`, `UTMAREDG`, `UBLKRED`, `STAS`,
    /// `REDAS`): addresses, coordinates and the guard are sinks.
    AsyncFromShared,
    /// Prefetch / cache control: the address is a sink; nothing is written.
    Prefetch,
    /// mbarrier (`SYNCS`): its address and its arrive count are sinks; its result (phase
    /// complete or not) carries the taint of its register operands (the barrier state itself
    /// depends on arrivals and byte counts, which are public).
    Mbarrier,
    /// Warpgroup MMA (`HGMMA`, ...): the accumulator becomes secret (operands come from shared
    /// memory and registers); descriptors are sinks.
    Gmma,
    /// Warp MMA (`HMMA`, ...): every source flows to the accumulator.
    Mma,
    /// Texture / surface access: every register operand is taken as a coordinate (a sink) and
    /// as a destination (secret: loaded from global memory, four registers from each).
    Texture,
    /// `BAR`: id, thread count and guard are control-flow sinks; the `.RED` forms deposit their
    /// predicate into the CTA's barrier-result cell (read by `B2R`), flow-insensitively since
    /// threads at other `BAR.RED` instructions take part in the same reduction.
    Barrier,
    /// `B2R`: reads the barrier-result cell.
    BarrierResult,
    /// Control transfer (`BRA`, `BRX`, `CALL`, `RET`, `EXIT`, `WARPSYNC`, ...): guard,
    /// predicate operand, target register and mask are control-flow sinks.
    Control,
    /// `NANOSLEEP`: its duration and guard are variable-latency sinks.
    Sleep,
    /// Reads of special registers and program counters (`S2R`, `CS2R`, `LEPC`): public.
    Special,
    /// Fences, scoreboard waits, no-ops, warpgroup arrive/wait, register reallocation,
    /// cluster barriers: no data flow; a register operand would still flow to a destination.
    Sync,
}

/// One opcode's rule.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct OpRule {
    pub op: &'static str,
    pub what: &'static str,
    pub class: Class,
    pub forms: &'static [&'static str],
}

use Class::*;
use Space::*;

const fn r(
    op: &'static str,
    what: &'static str,
    class: Class,
    forms: &'static [&'static str],
) -> OpRule {
    OpRule {
        op,
        what,
        class,
        forms,
    }
}

/// Generic forms of an ALU instruction writing one register (and maybe carry-out predicates),
/// reading values and maybe carry-in predicates.
const ALU: &[&str] = &["d q* s* b*"];
/// Compare-and-set-predicate: two predicate destinations, values, a combining predicate.
const SETP: &[&str] = &["q q s s b*", "q q s b*"];
/// Predicate logic: two destinations, three predicate sources, LUT immediates.
const PLOP: &[&str] = &["q q b b b s s", "q q b b b s", "q b b b s", "q q b b b"];
const NONE: &[&str] = &[""];
/// Texture and surface operations: which registers are destinations and which coordinates is
/// not spelled out by the listing (`TLD.LZ RZ, R7, R2, UR4, 0x0, 1D, 0x1`), so every register
/// is taken as both (see [`Class::Texture`]).
const TEX: &[&str] = &["q? s* m? s* x* s* x* s*"];

/// The table, grouped as NVIDIA's list groups it.
pub static TABLE: &[OpRule] = &[
    // Floating point.
    r("FADD", "FP32 add", Alu, ALU),
    r("FADD32I", "FP32 add", Alu, ALU),
    r(
        "FCHK",
        "FP32 range check (IEEE division)",
        AluLatency,
        &["q s s"],
    ),
    r("FFMA32I", "FP32 fused multiply-add", Alu, ALU),
    r("FFMA", "FP32 fused multiply-add", Alu, ALU),
    r("FMNMX", "FP32 min/max", Alu, ALU),
    r("FMUL", "FP32 multiply", Alu, ALU),
    r("FMUL32I", "FP32 multiply", Alu, ALU),
    r("FSEL", "FP select", Alu, ALU),
    r("FSET", "FP32 compare and set", Alu, ALU),
    r("FSETP", "FP32 compare and set predicate", Alu, SETP),
    r("FSWZADD", "FP32 swizzle add", Alu, ALU),
    r("MUFU", "multi-function unit", AluLatency, ALU),
    r("HADD2", "FP16 add", Alu, ALU),
    r("HADD2_32I", "FP16 add", Alu, ALU),
    r("HFMA2", "FP16 fused multiply-add", Alu, ALU),
    r("HFMA2_32I", "FP16 fused multiply-add", Alu, ALU),
    r("HMMA", "warp matrix multiply-accumulate", Mma, ALU),
    r("HMNMX2", "FP16 min/max", Alu, ALU),
    r("HMUL2", "FP16 multiply", Alu, ALU),
    r("HMUL2_32I", "FP16 multiply", Alu, ALU),
    r("HSET2", "FP16 compare and set", Alu, ALU),
    r("HSETP2", "FP16 compare and set predicate", Alu, SETP),
    r("DADD", "FP64 add", Alu, ALU),
    r("DFMA", "FP64 fused multiply-add", Alu, ALU),
    r("DMMA", "FP64 matrix multiply-accumulate", Mma, ALU),
    r("DMUL", "FP64 multiply", Alu, ALU),
    r("DSETP", "FP64 compare and set predicate", Alu, SETP),
    // Integer.
    r("BMMA", "bit matrix multiply-accumulate", Mma, ALU),
    r("BMSK", "bitfield mask", Alu, ALU),
    r("BREV", "bit reverse", Alu, ALU),
    r("FLO", "find leading one", Alu, &["d q? s*"]),
    r("IABS", "integer absolute value", Alu, ALU),
    r("IADD", "integer add", Alu, ALU),
    r("IADD3", "3-input integer add (carry-out/in)", Alu, ALU),
    r("IADD32I", "integer add", Alu, ALU),
    r("IDP", "integer dot product", Alu, ALU),
    r("IDP4A", "integer dot product", Alu, ALU),
    r("IMAD", "integer multiply-add", Alu, ALU),
    r("IMMA", "integer matrix multiply-accumulate", Mma, ALU),
    r("IMNMX", "integer min/max", Alu, ALU),
    r("IMUL", "integer multiply", Alu, ALU),
    r("IMUL32I", "integer multiply", Alu, ALU),
    r("ISCADD", "scaled integer add", Alu, ALU),
    r("ISCADD32I", "scaled integer add", Alu, ALU),
    r("ISETP", "integer compare and set predicate", Alu, SETP),
    r("LEA", "load effective address", Alu, ALU),
    r("LOP", "logic operation", Alu, ALU),
    r(
        "LOP3",
        "3-input logic operation",
        Alu,
        &["d s s s s b?", "q d s s s s b?"],
    ),
    r("LOP32I", "logic operation", Alu, ALU),
    r("POPC", "population count", Alu, ALU),
    r("SHF", "funnel shift", Alu, ALU),
    r("SHL", "shift left", Alu, ALU),
    r("SHR", "shift right", Alu, ALU),
    r("VABSDIFF", "absolute difference", Alu, ALU),
    r("VABSDIFF4", "absolute difference", Alu, ALU),
    r("VHMNMX", "FP16 3-input min/max", Alu, ALU),
    r("VIADD", "SIMD integer add", Alu, ALU),
    r("VIADDMNMX", "integer add with min/max", Alu, ALU),
    r("VIMNMX", "SIMD integer min/max", Alu, ALU),
    r("VIMNMX3", "integer 3-input min/max", Alu, ALU),
    // Conversion.
    r("F2F", "float to float", Alu, ALU),
    r("F2FP", "float down-convert and pack", Alu, ALU),
    r("F2I", "float to integer", Alu, ALU),
    r("I2F", "integer to float", Alu, ALU),
    r("I2I", "integer to integer", Alu, ALU),
    r("I2IP", "integer to integer and pack", Alu, ALU),
    r("I2FP", "integer to FP32 and pack", Alu, ALU),
    r("F2IP", "FP32 to integer and pack", Alu, ALU),
    r("FRND", "round to integer", Alu, ALU),
    // Movement.
    r("MOV", "move", Alu, &["d s s?"]),
    r("MOV32I", "move", Alu, &["d s s?"]),
    r("MOVM", "move matrix with transposition", Alu, ALU),
    r("PRMT", "byte permute", Alu, ALU),
    r("SEL", "select by predicate", Alu, ALU),
    r("SGXT", "sign extend", Alu, ALU),
    r("SHFL", "warp shuffle", Shuffle, &["q d s s s", "d s s s"]),
    // Predicates.
    r("PLOP3", "predicate logic", Alu, PLOP),
    r("PSETP", "combine predicates", Alu, PLOP),
    r("P2R", "predicates to register", Alu, &["d R s s", "d R s"]),
    r("R2P", "register to predicates", Alu, &["R s s", "R s"]),
    // Memory.
    r("FENCE", "memory visibility fence", Sync, NONE),
    r(
        "LD",
        "load, generic address",
        Load(Generic),
        &["d m", "q d m"],
    ),
    r("LDC", "load constant", Load(Constant), &["d s"]),
    r("LDG", "load global", Load(Global), &["d m", "q d m"]),
    r("LDGDEPBAR", "global load dependency barrier", Sync, NONE),
    r(
        "LDGMC",
        "reducing load (multicast)",
        Load(Global),
        &["d m", "q d m"],
    ),
    r(
        "LDGSTS",
        "async global to shared copy",
        AsyncToShared,
        &["m m", "m m b"],
    ),
    r("LDL", "load local", Load(Local), &["d m"]),
    r("LDS", "load shared", Load(Shared), &["d m"]),
    r("LDSM", "load matrix from shared", Load(Shared), &["d m"]),
    r("STSM", "store matrix to shared", Store(Shared), &["m s"]),
    r("ST", "store, generic address", Store(Generic), &["m s"]),
    r("STG", "store global", Store(Global), &["m s"]),
    r("STL", "store local", Store(Local), &["m s"]),
    r("STS", "store shared", Store(Shared), &["m s"]),
    r(
        "STAS",
        "async store to distributed shared",
        Store(Shared),
        &["m s", "m m s"],
    ),
    r(
        "SYNCS",
        "mbarrier (sync unit)",
        Mbarrier,
        &["q m s*", "d m s*", "m s*"],
    ),
    r(
        "MATCH",
        "match values across the warp",
        Collective,
        &["q d s", "d s"],
    ),
    r("QSPC", "query address space", Alu, &["q d m", "q d s"]),
    r(
        "ATOM",
        "atomic, generic address",
        Atomic(Generic),
        &["q? d m s*"],
    ),
    r("ATOMS", "atomic on shared", Atomic(Shared), &["d m s*"]),
    r("ATOMG", "atomic on global", Atomic(Global), &["q? d m s*"]),
    r(
        "RED",
        "reduction, generic address",
        Atomic(Generic),
        &["m s*"],
    ),
    r(
        "REDAS",
        "async reduction on distributed shared",
        Atomic(Shared),
        &["m s*", "m m s*"],
    ),
    r("REDG", "reduction on global", Atomic(Global), &["m s*"]),
    r("CCTL", "cache control", Prefetch, &["", "m"]),
    r("CCTLL", "cache control", Prefetch, &["", "m"]),
    r("CCTLT", "texture cache control", Prefetch, &["", "m", "s"]),
    r("ERRBAR", "error barrier", Sync, NONE),
    r("MEMBAR", "memory barrier", Sync, NONE),
    // Uniform datapath.
    r("R2UR", "vector to uniform register", Alu, &["d s", "q d s"]),
    r(
        "REDUX",
        "warp reduction into a uniform register",
        Collective,
        &["d s"],
    ),
    r("S2UR", "special register to uniform", Special, &["d x"]),
    r("UBMSK", "uniform bitfield mask", Alu, ALU),
    r("UBREV", "uniform bit reverse", Alu, ALU),
    r("UCGABAR_ARV", "cluster barrier arrive", Sync, NONE),
    r("UCGABAR_WAIT", "cluster barrier wait", Sync, NONE),
    r("UCLEA", "constant effective address", Alu, ALU),
    r("UF2FP", "uniform down-convert and pack", Alu, ALU),
    r("UFLO", "uniform find leading one", Alu, &["d q? s*"]),
    r("UIADD3", "uniform 3-input add", Alu, ALU),
    r("UIMAD", "uniform multiply-add", Alu, ALU),
    r("UISETP", "uniform compare and set predicate", Alu, SETP),
    r("ULDC", "uniform load constant", Load(Constant), &["d s"]),
    r("ULEA", "uniform effective address", Alu, ALU),
    r("ULEPC", "uniform load PC", Special, &["d", "d l"]),
    r("ULOP", "uniform logic", Alu, ALU),
    r(
        "ULOP3",
        "uniform 3-input logic",
        Alu,
        &["d s s s s b?", "q d s s s s b?"],
    ),
    r("ULOP32I", "uniform logic", Alu, ALU),
    r("UMOV", "uniform move", Alu, &["d s"]),
    r(
        "UP2UR",
        "uniform predicates to register",
        Alu,
        &["d R s s", "d R s"],
    ),
    r("UPLOP3", "uniform predicate logic", Alu, PLOP),
    r("UPOPC", "uniform population count", Alu, ALU),
    r("UPRMT", "uniform byte permute", Alu, ALU),
    r("UPSETP", "uniform predicate logic", Alu, PLOP),
    r(
        "UR2UP",
        "uniform register to predicates",
        Alu,
        &["R s s", "R s"],
    ),
    r("USEL", "uniform select", Alu, ALU),
    r("USETMAXREG", "reallocate registers", Sync, &["q s", "s"]),
    r("USGXT", "uniform sign extend", Alu, ALU),
    r("USHF", "uniform funnel shift", Alu, ALU),
    r("USHL", "uniform shift left", Alu, ALU),
    r("USHR", "uniform shift right", Alu, ALU),
    r(
        "VOTEU",
        "warp vote into a uniform register",
        Collective,
        &["q b", "d q b", "d b"],
    ),
    // Warpgroup.
    r("BGMMA", "warpgroup bit MMA", Gmma, &["d s* m s* b* x*"]),
    r("HGMMA", "warpgroup MMA", Gmma, &["d s* m s* b* x*"]),
    r("IGMMA", "warpgroup integer MMA", Gmma, &["d s* m s* b* x*"]),
    r("QGMMA", "warpgroup FP8 MMA", Gmma, &["d s* m s* b* x*"]),
    r(
        "WARPGROUP",
        "warpgroup arrive / wait",
        Sync,
        &["", "x s", "x", "s"],
    ),
    r(
        "WARPGROUPSET",
        "set warpgroup counters",
        Sync,
        &["", "s", "x s"],
    ),
    // TMA and bulk copies.
    r(
        "UBLKCP",
        "bulk copy",
        AsyncToShared,
        &["m m s*", "m m m s*"],
    ),
    r("UBLKPF", "bulk prefetch", Prefetch, &["m s*"]),
    r(
        "UBLKRED",
        "bulk copy from shared with reduction",
        AsyncFromShared,
        &["m m s*", "m m m s*"],
    ),
    r("UTMACCTL", "TMA cache control", Prefetch, &["m", ""]),
    r("UTMACMDFLUSH", "TMA command flush", Sync, NONE),
    r(
        "UTMALDG",
        "tensor load global to shared",
        AsyncToShared,
        &["m m", "m m s*"],
    ),
    r("UTMAPF", "tensor prefetch", Prefetch, &["m", "m m", "m s*"]),
    r(
        "UTMAREDG",
        "tensor store with reduction",
        AsyncFromShared,
        &["m m", "m m s*"],
    ),
    r(
        "UTMASTG",
        "tensor store shared to global",
        AsyncFromShared,
        &["m m", "m m s*"],
    ),
    // Texture and surface.
    r("TEX", "texture fetch", Texture, TEX),
    r("TLD", "texture load", Texture, TEX),
    r("TLD4", "texture load 4", Texture, TEX),
    r("TMML", "texture mip level", Texture, TEX),
    r("TXD", "texture fetch with derivatives", Texture, TEX),
    r("TXQ", "texture query", Texture, TEX),
    r("SUATOM", "surface atomic", Texture, TEX),
    r("SULD", "surface load", Texture, TEX),
    r("SURED", "surface reduction", Texture, TEX),
    r("SUST", "surface store", Texture, TEX),
    // Control.
    r("ACQBULK", "wait for bulk release", Sync, NONE),
    r(
        "BMOV",
        "move convergence barrier state",
        Alu,
        &["d x", "x s", "d x s"],
    ),
    r("BPT", "breakpoint / trap", Control, &["s", "x s?", "x", ""]),
    r("BRA", "relative branch", Control, &["b? l", "b? s l"]),
    r(
        "BREAK",
        "break out of a convergence barrier",
        Control,
        &["b? x"],
    ),
    r(
        "BRX",
        "indirect relative branch",
        Control,
        &["b? s l?", "b? s s l?"],
    ),
    r(
        "BRXU",
        "indirect branch, uniform offset",
        Control,
        &["b? s l?", "b? s s l?"],
    ),
    r("BSSY", "set convergence point", Control, &["x l"]),
    r(
        "BSYNC",
        "synchronise on convergence barrier",
        Control,
        &["b? x"],
    ),
    r("CALL", "call", Control, &["l", "s l?", "s s l?"]),
    r("CGAERRBAR", "cluster error barrier", Sync, NONE),
    r(
        "ELECT",
        "elect a leader lane",
        Collective,
        &["q d b", "q d s", "q b", "d b"],
    ),
    r("ENDCOLLECTIVE", "reset the collective mask", Sync, NONE),
    r("EXIT", "exit", Control, &["b?"]),
    r("JMP", "absolute jump", Control, &["b? l", "b? s l?"]),
    r(
        "JMX",
        "indirect absolute jump",
        Control,
        &["b? s l?", "b? s s l?"],
    ),
    r(
        "JMXU",
        "indirect jump, uniform offset",
        Control,
        &["b? s l?", "b? s s l?"],
    ),
    r("KILL", "kill thread", Control, &["b?"]),
    r("NANOSLEEP", "suspend", Sleep, &["s", "x s"]),
    r("PREEXIT", "dependent launch hint", Sync, NONE),
    r("RET", "return", Control, &["s l?", "b? s l?"]),
    r("RPCMOV", "PC register move", Alu, &["d s", "d x", "x s"]),
    r(
        "WARPSYNC",
        "synchronise lanes of a warp",
        Control,
        &["", "s", "b s"],
    ),
    r("YIELD", "yield", Sync, NONE),
    // Miscellaneous.
    r(
        "B2R",
        "barrier result to register",
        BarrierResult,
        &["d q?", "d x q?", "d s q?"],
    ),
    r(
        "BAR",
        "CTA / named barrier",
        Barrier,
        &["s", "s s", "s b", "s s b"],
    ),
    r(
        "CS2R",
        "special register to register",
        Special,
        &["d x", "d s"],
    ),
    r(
        "DEPBAR",
        "scoreboard wait",
        Sync,
        &["x s", "x s s", "s", "x"],
    ),
    r("GETLMEMBASE", "local memory base", Special, &["d"]),
    r("LEPC", "load PC", Special, &["d", "d l"]),
    r("NOP", "no operation", Sync, NONE),
    r("PMTRIG", "performance monitor trigger", Sync, &["s"]),
    r("S2R", "special register to register", Special, &["d x"]),
    r("SETCTAID", "set CTA id", Sync, &["s"]),
    r("SETLMEMBASE", "set local memory base", Sync, &["s"]),
    r("VOTE", "warp vote", Collective, &["q b", "d q b", "d b"]),
    // Printed by nvdisasm for sm_90a though absent from NVIDIA's list.
    r(
        "ARRIVES",
        "async-copy arrive on an mbarrier",
        Mbarrier,
        &["m s*", "s* m"],
    ),
];

/// Looks up an opcode's rule (base opcode, without modifiers).
pub fn lookup(op: &str) -> Option<&'static OpRule> {
    static INDEX: std::sync::OnceLock<std::collections::HashMap<&'static str, usize>> =
        std::sync::OnceLock::new();
    let idx = INDEX.get_or_init(|| TABLE.iter().enumerate().map(|(i, r)| (r.op, i)).collect());
    idx.get(op).map(|&i| &TABLE[i])
}

/// Operand kind as the form slots see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gpr,
    Pred,
    AllPreds,
    Value,
    Mem,
    Label,
    Other,
}

pub fn kind(o: &Operand) -> Kind {
    match o {
        Operand::Reg(r) => match r.reg {
            Reg::R(_) | Reg::UR(_) | Reg::Zero => Kind::Gpr,
            Reg::P(_) | Reg::UP(_) | Reg::True => Kind::Pred,
            Reg::PR | Reg::UPR => Kind::AllPreds,
        },
        Operand::Imm(_) | Operand::CBank { .. } => Kind::Value,
        Operand::Mem { .. } => Kind::Mem,
        Operand::Label(_) => Kind::Label,
        Operand::Other(_) => Kind::Other,
    }
}

/// Role of one operand in the matched form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    DestReg,
    DestPred,
    Src,
    SrcPred,
    Mem,
    Label,
    Named,
    AllPreds,
}

fn slot_accepts(slot: u8, k: Kind) -> Option<Role> {
    match (slot, k) {
        (b'd', Kind::Gpr) => Some(Role::DestReg),
        (b'q', Kind::Pred) => Some(Role::DestPred),
        (b's', Kind::Gpr | Kind::Value) => Some(Role::Src),
        (b'b', Kind::Pred) => Some(Role::SrcPred),
        (b'm', Kind::Mem) => Some(Role::Mem),
        (b'l', Kind::Label) => Some(Role::Label),
        (b'x', Kind::Other) => Some(Role::Named),
        (b'R', Kind::AllPreds) => Some(Role::AllPreds),
        _ => None,
    }
}

/// Matches `kinds` against one form; returns the role of every operand.
pub fn match_form(form: &str, kinds: &[Kind]) -> Option<Vec<Role>> {
    let slots: Vec<(u8, u8)> = form
        .split_whitespace()
        .map(|t| {
            let b = t.as_bytes();
            (b[0], *b.get(1).unwrap_or(&b'1'))
        })
        .collect();
    let mut roles = Vec::with_capacity(kinds.len());
    fn go(slots: &[(u8, u8)], kinds: &[Kind], roles: &mut Vec<Role>) -> bool {
        let Some(&(slot, rep)) = slots.first() else {
            return kinds.is_empty();
        };
        let take = |roles: &mut Vec<Role>, k: Kind| -> bool {
            match slot_accepts(slot, k) {
                Some(r) => {
                    roles.push(r);
                    true
                }
                None => false,
            }
        };
        match rep {
            b'?' => {
                if let Some(&k) = kinds.first() {
                    if take(roles, k) {
                        if go(&slots[1..], &kinds[1..], roles) {
                            return true;
                        }
                        roles.pop();
                    }
                }
                go(&slots[1..], kinds, roles)
            }
            b'*' => {
                // Greedy: as many as match, then back off.
                let mut n = 0;
                while n < kinds.len() && slot_accepts(slot, kinds[n]).is_some() {
                    n += 1;
                }
                loop {
                    let base = roles.len();
                    for &k in &kinds[..n] {
                        take(roles, k);
                    }
                    if go(&slots[1..], &kinds[n..], roles) {
                        return true;
                    }
                    roles.truncate(base);
                    if n == 0 {
                        return false;
                    }
                    n -= 1;
                }
            }
            _ => {
                let Some(&k) = kinds.first() else {
                    return false;
                };
                if !take(roles, k) {
                    return false;
                }
                if go(&slots[1..], &kinds[1..], roles) {
                    return true;
                }
                roles.pop();
                false
            }
        }
    }
    go(&slots, kinds, &mut roles).then_some(roles)
}

/// Why the table refuses an instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    UnknownOpcode(String),
    UnknownForm { op: String, kinds: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::UnknownOpcode(op) => write!(
                f,
                "opcode {op} is not in the audit's rule table (version {VERSION})"
            ),
            Refusal::UnknownForm { op, kinds } => write!(
                f,
                "operand form `{kinds}` of {op} matches none of its forms in the rule table \
                 (version {VERSION})"
            ),
        }
    }
}

fn kind_letter(k: Kind) -> &'static str {
    match k {
        Kind::Gpr => "reg",
        Kind::Pred => "pred",
        Kind::AllPreds => "PR",
        Kind::Value => "imm/const",
        Kind::Mem => "mem",
        Kind::Label => "label",
        Kind::Other => "name",
    }
}

/// The rule and operand roles of an instruction, or why the table refuses it.
pub fn classify(insn: &Insn) -> Result<(&'static OpRule, Vec<Role>), Refusal> {
    let op = insn.op();
    let rule = lookup(op).ok_or_else(|| Refusal::UnknownOpcode(op.to_string()))?;
    let kinds: Vec<Kind> = insn.operands.iter().map(kind).collect();
    for f in rule.forms {
        if let Some(roles) = match_form(f, &kinds) {
            return Ok((rule, roles));
        }
    }
    Err(Refusal::UnknownForm {
        op: insn.opcode.clone(),
        kinds: kinds
            .iter()
            .map(|&k| kind_letter(k))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::sass::parse_line;

    fn roles(line: &str) -> Vec<Role> {
        classify(&parse_line(line).unwrap()).unwrap().1
    }

    #[test]
    fn opcodes_are_unique_and_forms_parse() {
        let mut seen = std::collections::HashSet::new();
        for r in TABLE {
            assert!(seen.insert(r.op), "{} twice", r.op);
            assert!(!r.forms.is_empty(), "{} has no form", r.op);
            for f in r.forms {
                for t in f.split_whitespace() {
                    let b = t.as_bytes();
                    assert!(b"dqsbmlxR".contains(&b[0]), "{}: slot {t}", r.op);
                    assert!(b.len() == 1 || (b.len() == 2 && b"?*".contains(&b[1])));
                }
            }
        }
    }

    #[test]
    fn vote_forms_put_the_source_predicate_last() {
        use Role::*;
        assert_eq!(roles("/*0*/ VOTE.ANY P0, P0 ;"), vec![DestPred, SrcPred]);
        assert_eq!(
            roles("/*0*/ VOTE.ANY R0, PT, P0 ;"),
            vec![DestReg, DestPred, SrcPred]
        );
        assert_eq!(roles("/*0*/ VOTEU.ALL UP0, P1 ;"), vec![DestPred, SrcPred]);
        assert_eq!(
            roles("/*0*/ ISETP.LT.OR P0, PT, R7, 0x1, !P0 ;"),
            vec![DestPred, DestPred, Src, Src, SrcPred]
        );
        assert_eq!(
            roles("/*0*/ IADD3.X R5, RZ, R3, RZ, P0, !PT ;"),
            vec![DestReg, Src, Src, Src, SrcPred, SrcPred]
        );
        assert_eq!(
            roles("/*0*/ IADD3 R5, P0, P1, R3, R4, RZ ;"),
            vec![DestReg, DestPred, DestPred, Src, Src, Src]
        );
        assert_eq!(
            roles("/*0*/ SHFL.IDX PT, R9, R9, R0, 0x1f ;"),
            vec![DestPred, DestReg, Src, Src, Src]
        );
    }

    #[test]
    fn unknown_opcode_and_form_are_refused() {
        let e = classify(&parse_line("/*0*/ FROB R1, R2 ;").unwrap()).unwrap_err();
        assert_eq!(e, Refusal::UnknownOpcode("FROB".into()));
        assert!(e.to_string().contains("FROB"));
        let e = classify(&parse_line("/*0*/ VOTE.ANY R1, R2 ;").unwrap()).unwrap_err();
        assert!(matches!(e, Refusal::UnknownForm { .. }), "{e:?}");
        assert!(e.to_string().contains("VOTE.ANY"));
    }
}
