//! Every environment variable (`FLASHCORE_*`) that changes which kernel a call runs or how it is
//! launched, read here and nowhere else. All are measurement knobs: each picks among shipped
//! (audited) variants or launch modes, never an unaudited build, and is public (a function of the
//! environment only). Unset, the library follows its measured rules.
//!
//! Some are read on every call (a test may change them between calls), others once per process;
//! each function says which. Other variables configure tools, not kernels: the kernel cache
//! (`FLASHCORE_CACHE_DIR`), where the CUDA tools are (`FLASHCORE_CUDA_TOOLS`), the tool timeout
//! (`FLASHCORE_TOOL_TIMEOUT_S`), the compile log (`FLASHCORE_JIT_LOG`), and the benchmark's and
//! leakage test's own settings.

use std::sync::OnceLock;

fn number(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
}

/// Forward tile overrides, read on every call: `FLASHCORE_SPLIT` (key-range split across a
/// cluster), `FLASHCORE_BLOCK_M` (query rows per tile), `FLASHCORE_BLOCK_N` (keys per stage).
/// Which values count, and for which variants, is the selection's business.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwardTiles {
    pub split: Option<usize>,
    pub block_m: Option<usize>,
    pub block_n: Option<usize>,
}

pub fn forward_tiles() -> ForwardTiles {
    ForwardTiles {
        split: number("FLASHCORE_SPLIT"),
        block_m: number("FLASHCORE_BLOCK_M"),
        block_n: number("FLASHCORE_BLOCK_N"),
    }
}

/// `FLASHCORE_TILE_ORDER`, read on every call: `static` keeps causal prefill in the static
/// order (heavy and light tiles paired, a fixed round-robin) where the dynamic order (tiles
/// heaviest first from a counter) would run. Either order gives the same bits.
pub fn static_tile_order() -> bool {
    std::env::var("FLASHCORE_TILE_ORDER").as_deref() == Ok("static")
}

/// `FLASHCORE_DECODE_SPLIT=N` (1–4096), read once per process: decode's split size fixed at N
/// key blocks whatever Sk is (it changes the bits against the default rule, never their batch
/// invariance).
pub fn decode_split_blocks() -> Option<usize> {
    static FIXED: OnceLock<Option<usize>> = OnceLock::new();
    *FIXED.get_or_init(|| number("FLASHCORE_DECODE_SPLIT").filter(|n| (1..=4096).contains(n)))
}

/// `FLASHCORE_GATHER=rows`, read once per process: the paged builds compile the row-major
/// gather for pages TMA boxes cannot take (`FC_ROW_GATHER`, fc_producer.cuh's `gather_rows`:
/// four threads per key row, one block-table lookup per row) instead of the shipped one piece
/// per thread and lookup. A measurement build, not a shipped one: the same bytes land in the
/// same shared-memory places (the same bits), but it is not yet run on a GPU, and its decode
/// public-count paged softcap builds do not pass the audit yet (the counts pointer's provenance).
pub fn row_gather() -> bool {
    static ROWS: OnceLock<bool> = OnceLock::new();
    *ROWS.get_or_init(|| std::env::var("FLASHCORE_GATHER").as_deref().map(str::trim) == Ok("rows"))
}

/// The L2 promotion of decode's K/V tensor maps (`FLASHCORE_DECODE_KV_L2`, read once per
/// process): how many bytes around each TMA read the L2 fetches from DRAM. It changes which bytes
/// a load brings into the L2, never the bytes it delivers: the output bits are the same. Decode
/// reads each K/V row of 128-byte boxes once; a 256-byte promotion fetched the row's second box
/// with its first, and that box's own read then hit the L2, taking L2 bandwidth a streaming read
/// needs (128 bytes: 5–7.5% faster on an H200 at caches of 0.5–1 GB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Promotion {
    None,
    B64,
    /// Unset or anything else: 128 bytes.
    B128,
    /// 256 bytes, as every other map.
    B256,
}

/// `FLASHCORE_DECODE_KV_L2=none|64|128|256`.
pub fn decode_kv_l2() -> L2Promotion {
    static MODE: OnceLock<L2Promotion> = OnceLock::new();
    *MODE.get_or_init(|| {
        match std::env::var("FLASHCORE_DECODE_KV_L2")
            .as_deref()
            .map(str::trim)
        {
            Ok("none") => L2Promotion::None,
            Ok("64") => L2Promotion::B64,
            Ok("256") => L2Promotion::B256,
            _ => L2Promotion::B128,
        }
    })
}

/// The values of `FLASHCORE_PDL`: when the forward launches as a programmatic dependent of the
/// previous kernel in its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdlMode {
    /// `0`: never.
    Never,
    /// `1`: every eligible launch.
    Always,
    /// Unset or anything else: grids that leave SMs idle only (the measured rule).
    SmallGrids,
}

/// `FLASHCORE_PDL`, read once per process.
pub fn pdl() -> PdlMode {
    static MODE: OnceLock<PdlMode> = OnceLock::new();
    *MODE.get_or_init(
        || match std::env::var("FLASHCORE_PDL").as_deref().map(str::trim) {
            Ok("0") => PdlMode::Never,
            Ok("1") => PdlMode::Always,
            _ => PdlMode::SmallGrids,
        },
    )
}

/// `FLASHCORE_BWD_ONEPASS`, read on every call: `Some(true)` for `1` (the one-pass backward
/// where it exists), `Some(false)` for `0` (the two passes), `None` otherwise (the measured
/// default).
pub fn bwd_onepass() -> Option<bool> {
    match std::env::var("FLASHCORE_BWD_ONEPASS").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// `FLASHCORE_BWD_PINGPONG`, read on every call: `0` makes the two-pass consumers work in
/// lockstep instead of taking turns.
pub fn bwd_pingpong() -> bool {
    std::env::var("FLASHCORE_BWD_PINGPONG").as_deref() != Ok("0")
}

/// `FLASHCORE_BWD_OP_DIAG=1..4`, read on every call: the one-pass kernel's measurement builds
/// (never shipped); 0 when unset or out of range.
pub fn bwd_op_diag() -> u8 {
    match std::env::var("FLASHCORE_BWD_OP_DIAG").map(|s| s.parse::<u8>()) {
        Ok(Ok(d @ 1..=4)) => d,
        _ => 0,
    }
}

/// `FLASHCORE_BWD_CORE=0..4`, read on every call: the one-pass kernel's tile schedule (every one
/// is shipped); `None` when unset or out of range (the measured default).
pub fn bwd_core() -> Option<u8> {
    match std::env::var("FLASHCORE_BWD_CORE").map(|s| s.parse::<u8>()) {
        Ok(Ok(c @ 0..=4)) => Some(c),
        _ => None,
    }
}

/// `FLASHCORE_BWD_QROWS`, read on every call: `Some(64)` for `64` (the one pass keeps its 64-row
/// query steps where 80-row tiles are the default), `Some(80)` for `80`, `None` otherwise (the
/// default: 80-row tiles where that build exists, `BwdVariant::rows80`).
pub fn bwd_qrows() -> Option<usize> {
    match std::env::var("FLASHCORE_BWD_QROWS")
        .as_deref()
        .map(str::trim)
    {
        Ok("64") => Some(64),
        Ok("80") => Some(80),
        _ => None,
    }
}

/// `FLASHCORE_BWD_REGS`, read on every call: `Some(240)` for `240` (the d128 non-causal one pass
/// on 80-row tiles runs its 24/240-register build, same bits; a measurement knob), `None`
/// otherwise (the 40/232 build).
pub fn bwd_regs() -> Option<u32> {
    match std::env::var("FLASHCORE_BWD_REGS")
        .as_deref()
        .map(str::trim)
    {
        Ok("240") => Some(240),
        _ => None,
    }
}

/// `FLASHCORE_BWD_STAGE_STATS`, read once per process: `0` makes the dK/dV kernel read the LSE
/// and D rows from the workspace instead of staging them in shared memory.
pub fn bwd_stage_stats() -> bool {
    static KNOB: OnceLock<bool> = OnceLock::new();
    *KNOB.get_or_init(|| {
        std::env::var("FLASHCORE_BWD_STAGE_STATS").map_or(true, |v| v.trim() != "0")
    })
}
