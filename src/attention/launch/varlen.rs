//! Variable-length prefill: Q, K, V packed as `[total tokens, heads, dim]` with
//! `cu_seqlens_q` / `cu_seqlens_k` (i32, `batch + 1` prefix sums), one launch over every
//! sequence of the pack (per `VARLEN_CAPACITY` query tiles).
//!
//! The (public, docs/design.md §1) `cu_seqlens` become a **work list**: one item per query tile of
//! each non-empty sequence — the tile's first query token, the sequence's query rows from there
//! on, its first key token and its key count — sequence by sequence, the sequence with the
//! heaviest tile (most key blocks) first and each sequence's tiles together (their K/V shared in
//! L2), so no tile is spent on padding and long sequences start first. The kernel (`FC_VARLEN`,
//! kernels/fc_scheduler.cuh) reads item `1 + unit / heads` for work unit `unit` from
//! `__constant__` memory (entry 0: the launch's item count, where the walk ends), which is
//! filled before each launch by a stream-ordered copy. Constant data read at a public index is
//! public to the audit by construction; a table in global memory read through a parameter
//! pointer was tried first and audited clean only for some variants (the provenance analysis
//! reads shuffle sources flow-insensitively, so a shuffled register that held the table pointer
//! elsewhere taints the softmax).
//!
//! Two ways to build the list: on the host from checked `cu_seqlens` (`work_list`,
//! [`Context::attention_varlen_host`]), or — with no host synchronisation, so inside CUDA
//! graphs — on the device by the module's `flashcore_varlen_build` kernel
//! (kernels/fc_varlen_build.cuh: a one-CTA counting sort, with `seqused_k`/`seqused_q`) into a
//! workspace, then a device-to-device copy per launch (`launch_device_list`). The launch count
//! then comes from the bound `batch · ceil(max_seqlen_q / block_m)`; launches past the device's
//! count find a header of 0 and end at once. Within one weight the device's order is the order
//! its shared-memory atomics resolve in (run to run it may differ): it decides which CTA computes
//! a tile, never what the tile computes.
//!
//! A tile computes with its own sequence's tokens only: Q rows past the sequence's end are
//! computed and never stored, keys past its end are masked by select like a partial last
//! block's, and keys before its start are never loaded. What a sequence's rows get therefore
//! depends on its own tokens and lengths alone — not on its neighbours, nor on where it sits in
//! the pack (`tests/gpu_varlen.rs` checks the bits).

use super::{KernelParams, LoadedKernel};
use crate::abi::FastDiv;
use crate::attention::call::{Call, Keys};
use crate::attention::device::{Context, Element};
use crate::attention::{tensor_map, validate};
use crate::error::{Error, Result};
use crate::spec::Strides;
use crate::spec::{AttentionParams, Layout};
use cudarc::driver::{sys, CudaSlice, DevicePtr, DevicePtrMut};

/// Entries of the kernel's `__constant__` work list (kernels/fc_scheduler.cuh): a header (entry
/// 0: the launch's item count), then the items.
pub const VARLEN_SLOTS: usize = 4096;
/// Work items per launch.
pub const VARLEN_CAPACITY: usize = VARLEN_SLOTS - 1;

/// One query tile of one sequence of the pack, as the kernel reads it (an `int4`). The tile is
/// a sequence of its own: its rows are the last `rows` queries of the sequence, whose causal
/// mask (bottom-right) needs nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkItem {
    /// The tile's first query token in packed Q and O (`cu_seqlens_q[b] + m · block_m`).
    pub q_start: i32,
    /// The sequence's query rows from there to its end (the tile stores `min(rows, block_m)`).
    pub rows: i32,
    /// The sequence's first token in packed K and V (`cu_seqlens_k[b]`) and its key count.
    pub k_start: i32,
    pub len_k: i32,
}

impl WorkItem {
    pub fn fields(&self) -> [i32; 4] {
        [self.q_start, self.rows, self.k_start, self.len_k]
    }
}

/// Checks one `cu_seqlens` array: `batch + 1` entries, starting at 0, non-decreasing, ending at
/// the packed tensor's `total` tokens, each sequence at most `max_seqlen` long. `arg` names it
/// in the error.
pub fn check_cu_seqlens(
    arg: &'static str,
    cu: &[i32],
    batch: usize,
    total: usize,
    max_seqlen: usize,
) -> Result<()> {
    if cu.len() != batch + 1 {
        return Err(Error::invalid(
            arg,
            format!(
                "has {} entries, a batch of {batch} needs batch + 1 = {}",
                cu.len(),
                batch + 1
            ),
        ));
    }
    if cu[0] != 0 {
        return Err(Error::invalid(
            arg,
            format!("must start at 0, starts at {}", cu[0]),
        ));
    }
    for (i, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(Error::invalid(
                arg,
                format!(
                    "must be non-decreasing: entry {} is {} after {}",
                    i + 1,
                    w[1],
                    w[0]
                ),
            ));
        }
        let len = (w[1] - w[0]) as usize;
        if len > max_seqlen {
            return Err(Error::invalid(
                arg,
                format!("sequence {i} has {len} tokens, more than max_seqlen {max_seqlen}"),
            ));
        }
    }
    let last = cu[batch];
    if last as usize != total {
        return Err(Error::invalid(
            arg,
            format!("last entry is {last}, the packed tensor holds {total} tokens"),
        ));
    }
    Ok(())
}

/// Key blocks a causal or full tile visits (kernels/fc_scheduler.cuh's `num_kv_blocks`): the
/// work list's weight.
fn kv_blocks(item: &WorkItem, block_m: usize, block_n: usize, causal: bool) -> i64 {
    let keys = item.len_k as i64;
    let n = (keys + block_n as i64 - 1) / block_n as i64;
    if !causal {
        return n;
    }
    let sq = item.rows as i64;
    let last_row = (block_m as i64).min(sq) - 1;
    let visible = keys.min(last_row + keys - sq + 1);
    if visible <= 0 {
        0
    } else {
        n.min((visible + block_n as i64 - 1) / block_n as i64)
    }
}

/// The work list of a pack (`cu_q`, `cu_k` already checked): every query tile of every
/// sequence with queries, sequence by sequence — the sequence whose heaviest tile is heaviest
/// first (ties in pack order) — and inside a sequence its tiles heaviest first (last query
/// block first). A sequence's tiles are neighbours in the list, so the CTAs running at one time
/// share its K/V in L2 (a per-tile sort sent them to as many sequences as there are CTAs); the
/// persistent grid's stride through the list still deals each CTA a spread of tile weights. The
/// order decides only which CTA computes a tile, never what it computes.
pub fn work_list(
    cu_q: &[i32],
    cu_k: &[i32],
    block_m: usize,
    block_n: usize,
    causal: bool,
) -> Vec<WorkItem> {
    let mut seqs: Vec<Vec<WorkItem>> = Vec::new();
    for b in 0..cu_q.len().saturating_sub(1) {
        let len_q = cu_q[b + 1] - cu_q[b];
        let tiles = (len_q as usize).div_ceil(block_m);
        seqs.push(
            (0..tiles)
                .rev()
                .map(|m| {
                    let row0 = (m * block_m) as i32;
                    WorkItem {
                        q_start: cu_q[b] + row0,
                        rows: len_q - row0,
                        k_start: cu_k[b],
                        len_k: cu_k[b + 1] - cu_k[b],
                    }
                })
                .collect(),
        );
    }
    // Stable: equal weights keep pack order. A sequence's weight is its first (heaviest) tile's.
    let weight = |s: &Vec<WorkItem>| {
        s.first()
            .map_or(0, |it| kv_blocks(it, block_m, block_n, causal))
    };
    seqs.sort_by_key(|s| std::cmp::Reverse(weight(s)));
    seqs.concat()
}

pub use crate::kernels::select::varlen as variant_for;

/// Checks the shape of a varlen call and returns the packed totals (queries, keys).
/// `params.batch` is the number of sequences, `params.seqlen_q` / `seqlen_k` the
/// `max_seqlen_q` / `max_seqlen_k` bounds; `q_len` … are the buffers' element counts.
pub fn check_varlen(
    params: &AttentionParams,
    cu_q: &[i32],
    cu_k: &[i32],
    q_len: usize,
    kv_len: [usize; 2],
    out_len: usize,
    lse_len: Option<usize>,
) -> Result<(usize, usize)> {
    let (total_q, total_k) = check_varlen_shapes(params, q_len, kv_len, out_len, lse_len)?;
    check_cu_seqlens("cu_seqlens_q", cu_q, params.batch, total_q, params.seqlen_q)?;
    check_cu_seqlens("cu_seqlens_k", cu_k, params.batch, total_k, params.seqlen_k)?;
    Ok((total_q, total_k))
}

/// [`check_varlen`] without the `cu_seqlens` values (the device-built list's call, which never
/// reads them on the host).
pub fn check_varlen_shapes(
    params: &AttentionParams,
    q_len: usize,
    kv_len: [usize; 2],
    out_len: usize,
    lse_len: Option<usize>,
) -> Result<(usize, usize)> {
    validate::check_params(params)?;
    if params.layout != Layout::Bshd {
        return Err(Error::invalid(
            "layout",
            "varlen tensors are packed [total tokens, heads, head_dim] (bshd)",
        ));
    }
    let row_q = params.heads_q * params.head_dim;
    let row_k = params.heads_kv * params.head_dim;
    if q_len % row_q != 0 {
        return Err(Error::invalid(
            "q",
            format!(
                "has {q_len} elements, not a whole number of [heads_q, head_dim] = {row_q} rows"
            ),
        ));
    }
    let total_q = q_len / row_q;
    for (name, len) in [("k", kv_len[0]), ("v", kv_len[1])] {
        if len % row_k != 0 {
            return Err(Error::invalid(
                name,
                format!(
                    "has {len} elements, not a whole number of [heads_kv, head_dim] = {row_k} rows"
                ),
            ));
        }
    }
    if kv_len[0] != kv_len[1] {
        return Err(Error::invalid(
            "v",
            format!("has {} elements, k has {}", kv_len[1], kv_len[0]),
        ));
    }
    let total_k = kv_len[0] / row_k;
    if out_len != q_len {
        return Err(Error::invalid(
            "out",
            format!("has {out_len} elements, q has {q_len}"),
        ));
    }
    if let Some(l) = lse_len {
        if l != params.heads_q * total_q {
            return Err(Error::invalid(
                "lse",
                format!(
                    "has {l} elements, [heads_q, total_q] needs {}",
                    params.heads_q * total_q
                ),
            ));
        }
    }
    // Byte extents TMA can address (the totals fit an i32: they are cu_seqlens entries).
    let bytes = (total_q * row_q).max(total_k * row_k) as u128 * params.dtype.size() as u128;
    if bytes >= (1u128 << 40) {
        return Err(Error::invalid(
            "q",
            "tensor larger than 2^40 bytes cannot be addressed by TMA",
        ));
    }
    Ok((total_q, total_k))
}

/// Where and how a varlen call's launches go: the stream, the SM count (the persistent grid's
/// size) and the kernel loaded for that stream (its `__constant__` work list is the module's).
pub(crate) struct Target<'a> {
    pub stream: sys::CUstream,
    pub num_sms: usize,
    pub kernel: &'a LoadedKernel,
}

/// A varlen call's device buffers: q, k, v, o, lse (0: none) and the element strides of q, k, v,
/// o as (unused batch, seq, head), the pack's totals (query tokens, key tokens), and the
/// learnable sinks (fp32 `[heads_q]`, secret; 0: none).
#[derive(Clone, Copy)]
pub(crate) struct Buffers {
    pub ptrs: [u64; 5],
    pub strides: [Strides; 4],
    pub totals: [usize; 2],
    pub sinks: u64,
    /// K and V are a paged cache's pools, read through its block table; `None`: packed.
    pub paged: Option<VarlenPages>,
}

impl Buffers {
    /// Contiguous packed `[total, heads, head_dim]` tensors.
    pub fn contiguous(p: &AttentionParams, ptrs: [u64; 5], totals: [usize; 2]) -> Buffers {
        let q = Strides::contiguous(Layout::Bshd, totals[0], p.heads_q, p.head_dim);
        let kv = Strides::contiguous(Layout::Bshd, totals[1], p.heads_kv, p.head_dim);
        Buffers {
            ptrs,
            strides: [q, kv, kv, q],
            totals,
            sinks: 0,
            paged: None,
        }
    }
}

/// A paged KV cache read in place by a varlen call (chunked prefill over pages; `FC_PAGED`,
/// kernels/fc_producer.cuh). K and V are the pools `[num_pages, page_size, heads_kv, head_dim]`
/// (their strides' `batch` is the page stride), `params.seqlen_k` is the capacity (a whole number
/// of pages: the table's row length times the page size), and the pack's keys are virtual rows:
/// sequence b's key j is row `b · capacity + j`. So the pack's key total is `batch · capacity` and
/// `cu_seqlens_k[b]` is `b · capacity` plus the sequence's first key. Output bits are those of
/// the same keys packed contiguously.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarlenPages {
    /// i32 `[batch, capacity / page_size]`, contiguous (public metadata; entries are clamped
    /// into the pool).
    pub block_table: u64,
    pub pages: crate::spec::Pages,
    /// Some sequence's first key is past `b · capacity` (left padding): the kernel gathers rows
    /// instead of loading TMA boxes, which need every key block on a box boundary (same bits).
    pub left_padded: bool,
}

impl VarlenPages {
    /// Whether the kernel gathers rows (`cp.async`) instead of loading TMA boxes: page sizes
    /// that are not a power of two of at least 16 rows, or left padding. Public.
    pub(crate) fn gather(&self) -> bool {
        !self.pages.tma_boxes() || self.left_padded
    }

    /// Rows per K/V TMA box: the block, or the page where pages are shorter.
    fn box_rows(&self, keys: u32) -> u32 {
        keys.min(self.pages.page_size as u32)
    }
}

/// Query tiles each sequence may have (`ceil(max_seqlen_q / block_m)`), and the work-list chunks
/// (launches) of a device-built list: enough for every sequence to have that many.
pub fn device_chunks(params: &AttentionParams) -> (usize, usize) {
    let block_m = variant_for(params).tile().block_m;
    let tiles = params.seqlen_q.div_ceil(block_m);
    let slots = params.batch.saturating_mul(tiles);
    (tiles, slots.div_ceil(VARLEN_CAPACITY))
}

/// Bytes of device workspace a call with a device-built work list needs: one image of the
/// kernel's work list per launch (16-byte aligned).
pub fn workspace_bytes(params: &AttentionParams) -> usize {
    device_chunks(params).1 * VARLEN_SLOTS * 16
}

/// Enqueues the varlen launches of a host-built work list: per chunk of at most
/// [`VARLEN_CAPACITY`] items, a copy of its header and items into the kernel's `__constant__`
/// work list and a launch (each ordered after the last on the stream).
///
/// # Safety
/// The buffers hold `totals` rows of the dtype (16-byte aligned) as their strides say, `lse`
/// (unless 0) `heads_q · total_q` f32s; all alive until the kernels end; `stream` is live.
unsafe fn launch_host_list(
    target: &Target,
    params: &AttentionParams,
    bufs: Buffers,
    items: &[WorkItem],
) -> Result<()> {
    let (_, work_ptr) = build_of(target.kernel)?;
    for chunk in items.chunks(VARLEN_CAPACITY) {
        let mut flat: Vec<i32> = vec![chunk.len() as i32, 0, 0, 0];
        flat.extend(chunk.iter().flat_map(|it| it.fields()));
        cudarc::driver::result::memcpy_htod_async(work_ptr, &flat, target.stream)?;
        launch_chunk(target, params, bufs, chunk.len())?;
    }
    Ok(())
}

fn build_of(kernel: &LoadedKernel) -> Result<(&cudarc::driver::CudaFunction, u64)> {
    kernel
        .build
        .as_ref()
        .map(|(f, w)| (f, *w))
        .ok_or_else(|| Error::Other("not a varlen kernel".into()))
}

/// Enqueues a varlen call whose work list the device builds from `meta` = (cu_seqlens_q,
/// cu_seqlens_k, seqused_k or 0, seqused_q or 0), i32 device arrays, with no host synchronisation: the builder
/// kernel writes every launch's list into `workspace` ([`workspace_bytes`]), then per launch a
/// device-to-device copy into the `__constant__` work list and the launch, all on the stream
/// (capturable in a CUDA graph). The launch count comes from the bound `batch ·
/// ceil(max_seqlen_q / block_m)`; units past a launch's device-side count end the walk.
///
/// # Safety
/// As for [`launch_host_list`]; `meta` hold `batch + 1`, `batch + 1`, `batch`, `batch` i32s (any values:
/// the builder clamps them into the pack) and `workspace` [`workspace_bytes`] bytes, used by no
/// other launch that may run at the same time.
pub(crate) unsafe fn launch_device_list(
    target: &Target,
    params: &AttentionParams,
    bufs: Buffers,
    meta: [u64; 4],
    workspace: u64,
) -> Result<()> {
    let (tiles, chunks) = device_chunks(params);
    let slots = params.batch * tiles;
    if slots == 0 || bufs.totals[0] == 0 {
        return Ok(()); // no query row anywhere: nothing to write
    }
    if slots > i32::MAX as usize || chunks * VARLEN_SLOTS > i32::MAX as usize {
        return Err(Error::invalid(
            "max_seqlen_q",
            "too many query tiles: batch · ceil(max_seqlen_q / 128) must fit in an i32",
        ));
    }
    let (build, work_ptr) = build_of(target.kernel)?;
    let [cu_q, cu_k, used_k, used_q] = meta;
    let mut a_cu_q = cu_q;
    let mut a_cu_k = cu_k;
    let mut a_used = used_k;
    let mut a_used_q = used_q;
    let mut a_out = workspace;
    let mut a_batch = params.batch as i32;
    let mut a_tiles = tiles as i32;
    let mut a_total_q = bufs.totals[0] as i32;
    let mut a_total_k = bufs.totals[1] as i32;
    let mut a_chunks = chunks as i32;
    let mut args: [*mut std::ffi::c_void; 10] = [
        (&mut a_cu_q) as *mut u64 as *mut _,
        (&mut a_cu_k) as *mut u64 as *mut _,
        (&mut a_used) as *mut u64 as *mut _,
        (&mut a_used_q) as *mut u64 as *mut _,
        (&mut a_out) as *mut u64 as *mut _,
        (&mut a_batch) as *mut i32 as *mut _,
        (&mut a_tiles) as *mut i32 as *mut _,
        (&mut a_total_q) as *mut i32 as *mut _,
        (&mut a_total_k) as *mut i32 as *mut _,
        (&mut a_chunks) as *mut i32 as *mut _,
    ];
    cudarc::driver::result::launch_kernel(
        build.cu_function(),
        (1, 1, 1),
        (BUILD_THREADS, 1, 1),
        0,
        target.stream,
        &mut args,
    )?;
    for c in 0..chunks {
        let items = VARLEN_CAPACITY.min(slots - c * VARLEN_CAPACITY);
        let src = workspace + (c * VARLEN_SLOTS * 16) as u64;
        cudarc::driver::result::memcpy_dtod_async(work_ptr, src, (1 + items) * 16, target.stream)?;
        launch_chunk(target, params, bufs, items)?;
    }
    Ok(())
}

/// O's tensor map over the pack (box: one warp's 16 rows) where the epilogue stores O with TMA
/// ([`super::stores_o_by_tma`]); `None` keeps the stores from registers. A warp whose rows run
/// past its sequence stores from registers either way (the kernel's choice, by the sequence's
/// length).
fn o_map(
    p: &AttentionParams,
    tile: &crate::kernels::Tile,
    o: u64,
    o_st: Strides,
    total_q: usize,
) -> Option<sys::CUtensorMap> {
    if !(total_q > 0 && super::stores_o_by_tma(p, tile, o, o_st)) {
        return None;
    }
    tensor_map::encode(o, p.dtype, o_st, 1, total_q, p.heads_q, p.head_dim, 16).ok()
}

/// Threads of the builder kernel (kernels/fc_varlen_build.cuh).
const BUILD_THREADS: u32 = 1024;

/// One launch over at most `items` work items now in constant memory (the header says how many
/// there are).
unsafe fn launch_chunk(
    target: &Target,
    params: &AttentionParams,
    bufs: Buffers,
    items: usize,
) -> Result<()> {
    let p = params;
    let kernel = target.kernel;
    let tile = kernel.variant.tile();
    let [q, k, v, o, lse] = bufs.ptrs;
    let [total_q, total_k] = bufs.totals;
    let [q_st, k_st, v_st, o_st] = bufs.strides;
    let rows = tile.block_m as u32;
    let keys = tile.block_n as u32;
    // A pack without keys still gets maps of one row: every item has no key then (the lists
    // clamp key counts into the pack), so no K/V load is ever issued through them. A paged
    // cache's maps span the pools, one box per page a block spans (unused when gathering).
    let (kv_pack, kv_rows, box_rows) = match bufs.paged {
        Some(pg) => (pg.pages.num_pages, pg.pages.page_size, pg.box_rows(keys)),
        None => (1, total_k.max(1), keys),
    };
    let q_map = tensor_map::encode(q, p.dtype, q_st, 1, total_q, p.heads_q, p.head_dim, rows)?;
    let kv_map = |ptr, st| {
        tensor_map::encode(
            ptr, p.dtype, st, kv_pack, kv_rows, p.heads_kv, p.head_dim, box_rows,
        )
    };
    let k_map = kv_map(k, k_st)?;
    let v_map = kv_map(v, v_st)?;
    let paged = bufs.paged;
    let divisor = paged.map_or((0, 0), |pg| pg.pages.divisor());
    let units = items as u128 * p.heads_q as u128;
    if units > i32::MAX as u128 {
        return Err(Error::invalid(
            "cu_seqlens_q",
            "too many query tiles: heads · tiles must fit in an i32",
        ));
    }
    let [sb, ss, sh] = o_st.as_array();
    let scale = p.softmax_scale();
    // Windows and softcap apply per sequence (each tile's mask is aligned to its own counts);
    // the unbounded sides use the pack's totals.
    let (window_left, window_right, softcap_in, softcap_out) =
        super::feature_fields(p, total_q, total_k);
    let hq = FastDiv::new(p.heads_q as u32);
    let o_map = o_map(p, &tile, o, o_st, total_q);
    let mut block = Box::new(KernelParams {
        q_map,
        k_map,
        v_map,
        o_ptr: o,
        lse_ptr: lse,
        lens_ptr: 0,
        q_ptr_for_control: q,
        o_stride_b: sb,
        o_stride_s: ss,
        o_stride_h: sh,
        seqlen_q: total_q as i32,
        seqlen_k: total_k as i32,
        heads_q: p.heads_q as i32,
        group: (p.heads_q / p.heads_kv) as i32,
        scale_log2: scale * std::f32::consts::LOG2_E,
        scale,
        num_m_blocks: 0,
        units_per_head: 1,
        num_units: units as i32,
        pair_tiles: 0,
        ws_o_ptr: 0,
        ws_ml_ptr: 0,
        pack: 1,
        pack_shift: 0,
        split_blocks: 0,
        num_splits: 1,
        table_ptr: paged.map_or(0, |pg| pg.block_table),
        // The table read as one row (the virtual pack's rows: VarlenPages).
        table_stride: paged.map_or(0, |pg| (p.batch * p.seqlen_k / pg.pages.page_size) as i32),
        num_pages: paged.map_or(0, |pg| pg.pages.num_pages as i32),
        page_shift: paged.map_or(0, |pg| pg.pages.page_size.trailing_zeros() as i32),
        box_rows: box_rows as i32,
        starts_ptr: 0,
        sinks_ptr: bufs.sinks,
        window_left,
        window_right,
        softcap_in,
        softcap_out,
        units_per_head_mul: 0,
        units_per_head_shift: 0,
        heads_q_mul: hq.mul,
        heads_q_shift: hq.shift,
        o_tma: o_map.is_some() as i32,
        // SAFETY: a tensor map is plain bytes; the kernel reads it only when o_tma is 1.
        o_map: o_map.unwrap_or(unsafe { std::mem::zeroed() }),
        tile_counter: 0,
        section_heads: 0,
        section_heads_mul: 0,
        section_heads_shift: 0,
        section_units_mul: 0,
        section_units_shift: 0,
        page_size: paged.map_or(0, |pg| pg.pages.page_size as i32),
        page_mul: divisor.0,
        page_div_shift: divisor.1,
        gather: paged.is_some_and(|pg| pg.gather()) as i32,
        k_ptr: if paged.is_some() { k } else { 0 },
        v_ptr: if paged.is_some() { v } else { 0 },
        k_stride: if paged.is_some() {
            k_st.as_array()
        } else {
            [0; 3]
        },
        v_stride: if paged.is_some() {
            v_st.as_array()
        } else {
            [0; 3]
        },
    });
    let grid = (units.min(target.num_sms.max(1) as u128) as u32, 1, 1);
    let mut args: [*mut std::ffi::c_void; 1] =
        [(&mut *block) as *mut KernelParams as *mut std::ffi::c_void];
    cudarc::driver::result::launch_kernel(
        kernel.function.cu_function(),
        grid,
        (tile.threads() as u32, 1, 1),
        kernel.smem_bytes as u32,
        target.stream,
        &mut args,
    )?;
    Ok(())
}

/// The packed tensors' device addresses (q, k, v, out, and lse or 0), each checked for
/// alignment (16 bytes for TMA's inputs, 4 for the outputs), with the guards that order their
/// use on `stream` until dropped.
fn packed_ptrs<'a, T: Element>(
    stream: &'a std::sync::Arc<cudarc::driver::CudaStream>,
    q: &'a CudaSlice<T>,
    k: &'a CudaSlice<T>,
    v: &'a CudaSlice<T>,
    out: &'a mut CudaSlice<T>,
    lse: Option<&'a mut CudaSlice<f32>>,
) -> Result<([u64; 5], Vec<cudarc::driver::SyncOnDrop<'a>>)> {
    let align = validate::TENSOR_ALIGN;
    let mut guards = Vec::with_capacity(5);
    let mut ptrs = [0u64; 5];
    for (i, (name, t)) in [("q", q), ("k", k), ("v", v)].into_iter().enumerate() {
        let (ptr, g) = t.device_ptr(stream);
        validate::check_buffer(name, t.len(), t.len(), ptr, align)?;
        ptrs[i] = ptr;
        guards.push(g);
    }
    let out_len = out.len();
    let (o_ptr, g) = out.device_ptr_mut(stream);
    validate::check_buffer("out", out_len, out_len, o_ptr, 4)?;
    ptrs[3] = o_ptr;
    guards.push(g);
    if let Some(l) = lse {
        let len = l.len();
        let (p, g) = l.device_ptr_mut(stream);
        validate::check_buffer("lse", len, len, p, 4)?;
        ptrs[4] = p;
        guards.push(g);
    }
    Ok((ptrs, guards))
}

/// The sinks' device address (0 for none), checked: one f32 per query head, 4-byte aligned.
fn sinks_ptr<'a>(
    stream: &'a std::sync::Arc<cudarc::driver::CudaStream>,
    params: &AttentionParams,
    sinks: Option<&'a CudaSlice<f32>>,
) -> Result<(u64, Option<cudarc::driver::SyncOnDrop<'a>>)> {
    match sinks {
        Some(s) => {
            let (p, g) = s.device_ptr(stream);
            validate::check_buffer("sinks", s.len(), params.heads_q, p, 4)?;
            Ok((p, Some(g)))
        }
        None => Ok((0, None)),
    }
}

/// The device pointer of an optional slice (0 for none).
fn opt_ptr<T>(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    s: Option<&CudaSlice<T>>,
) -> u64 {
    s.map_or(0, |s| s.device_ptr(stream).0)
}

impl Context {
    /// Variable-length attention over packed sequences (flash-attn's `flash_attn_varlen_func`):
    /// `q` is `[total_q, heads_q, head_dim]`, `k` and `v` `[total_k, heads_kv, head_dim]`,
    /// sequence `b` owning query tokens `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` and key tokens
    /// `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]` (i32, `batch + 1` entries each, on the device;
    /// public metadata). `params.batch` is the number of sequences and `params.seqlen_q` /
    /// `seqlen_k` are `max_seqlen_q` / `max_seqlen_k` (every sequence must fit them); heads, head
    /// dim, dtype, causal (bottom-right per sequence) and scale as for [`Context::attention`];
    /// the layout must be `Bshd`. `out` is packed like `q`; `lse`, when given, is fp32
    /// `[heads_q, total_q]`. Empty sequences are allowed (no queries: nothing to write; no keys:
    /// O = 0, LSE = −inf).
    ///
    /// This entry point downloads `cu_seqlens` once to check them (a host synchronisation), then
    /// runs exactly as [`Context::attention_varlen_device`], which does not check their values
    /// and never synchronises.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        cu_seqlens_q: &CudaSlice<i32>,
        cu_seqlens_k: &CudaSlice<i32>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let cu_q = self.download(cu_seqlens_q)?;
        let cu_k = self.download(cu_seqlens_k)?;
        validate::check_buffers_dtype(params, T::DTYPE)?;
        check_varlen(
            params,
            &cu_q,
            &cu_k,
            q.len(),
            [k.len(), v.len()],
            out.len(),
            lse.as_ref().map(|l| l.len()),
        )?;
        self.attention_varlen_device(
            params,
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            None,
            None,
            out,
            lse,
        )
    }

    /// [`Context::attention_varlen`] with the work list built on the device from the
    /// `cu_seqlens` (and `seqused_k`: i32 `[batch]`, sequence `b` then attends to its first
    /// `seqused_k[b]` keys only; `seqused_q`: only its first `seqused_q[b]` queries are
    /// computed, the rest of its rows left as they are) as they are when the stream reaches the
    /// call: no host
    /// synchronisation, capturable in a CUDA graph. Only the shapes are checked; values that
    /// break the contract (not a prefix sum of the pack, a sequence longer than its max_seqlen)
    /// give wrong rows but never an access outside the buffers (the builder clamps them).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_device<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        cu_seqlens_q: &CudaSlice<i32>,
        cu_seqlens_k: &CudaSlice<i32>,
        seqused_k: Option<&CudaSlice<i32>>,
        seqused_q: Option<&CudaSlice<i32>>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        self.attention_varlen_device_with_sinks(
            params,
            q,
            k,
            v,
            [cu_seqlens_q, cu_seqlens_k],
            [seqused_k, seqused_q],
            None,
            out,
            lse,
        )
    }

    /// [`Context::attention_varlen_device`] with the window, softcap and sinks: `params.window` and
    /// `params.softcap` (each sequence's window bottom-right aligned to its own counts), and
    /// `sinks`, learnable attention sinks (fp32 `[heads_q]`, gpt-oss; secret: arithmetic only).
    /// `cu_seqlens` = (q, k), `seqused` = (k, q) as there.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_device_with_sinks<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        [cu_seqlens_q, cu_seqlens_k]: [&CudaSlice<i32>; 2],
        [seqused_k, seqused_q]: [Option<&CudaSlice<i32>>; 2],
        sinks: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let keys = Keys::Varlen {
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            seqused_k,
            seqused_q,
        };
        let call = Call {
            sinks,
            ..Call::new(params, q, keys)
        };
        self.run(&call, out, lse)
    }

    /// Varlen with device offsets ([`Keys::Varlen`]), over packed K and V or, with `pages`, a
    /// paged cache's pools and block table ([`VarlenPages`]: `cu_seqlens_k` then holds the
    /// virtual pack's offsets, `params.seqlen_k` the capacity).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::attention) fn varlen_device<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        [k, v]: [&CudaSlice<T>; 2],
        pages: Option<(&CudaSlice<i32>, crate::spec::Pages)>,
        [cu_seqlens_q, cu_seqlens_k]: [&CudaSlice<i32>; 2],
        [seqused_k, seqused_q]: [Option<&CudaSlice<i32>>; 2],
        sinks: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        validate::check_buffers_dtype(params, T::DTYPE)?;
        let kv_len = match pages {
            Some((table, pg)) => check_pools(params, [k.len(), v.len()], table.len(), &pg)?,
            None => [k.len(), v.len()],
        };
        let (total_q, total_k) = check_varlen_shapes(
            params,
            q.len(),
            kv_len,
            out.len(),
            lse.as_ref().map(|l| l.len()),
        )?;
        check_meta_len("cu_seqlens_q", cu_seqlens_q.len(), params.batch + 1)?;
        check_meta_len("cu_seqlens_k", cu_seqlens_k.len(), params.batch + 1)?;
        if let Some(u) = seqused_k {
            check_meta_len("seqused_k", u.len(), params.batch)?;
        }
        if let Some(u) = seqused_q {
            check_meta_len("seqused_q", u.len(), params.batch)?;
        }
        let stream = self.stream().clone();
        let (sinks_ptr, _g) = sinks_ptr(&stream, params, sinks)?;
        let variant = match pages {
            Some(_) => crate::kernels::select::varlen_paged(params),
            None => variant_for(params),
        };
        let kernel = self.kernel(variant)?;
        let ws_bytes = workspace_bytes(params);
        if total_q == 0 || ws_bytes == 0 {
            return Ok(());
        }
        if total_k == 0 {
            // No key anywhere: every row is fully masked (O = 0, LSE = −inf); nothing to load.
            stream.memset_zeros(out)?;
            if let Some(l) = lse {
                let inf = vec![f32::NEG_INFINITY; l.len()];
                self.copy_to_device(&inf, l)?;
            }
            return Ok(());
        }
        let ws = self.alloc::<u8>(ws_bytes)?;
        let (ptrs, _guards) = packed_ptrs(&stream, q, k, v, out, lse)?;
        let meta = [
            cu_seqlens_q.device_ptr(&stream).0,
            cu_seqlens_k.device_ptr(&stream).0,
            opt_ptr(&stream, seqused_k),
            opt_ptr(&stream, seqused_q),
        ];
        let _table_guard = match pages {
            Some((table, _)) => {
                let (ptr, g) = table.device_ptr(&stream);
                validate::check_buffer("block_table", table.len(), table.len(), ptr, 4)?;
                Some((ptr, g))
            }
            None => None,
        };
        let ws_ptr = ws.device_ptr(&stream).0;
        let target = Target {
            stream: stream.cu_stream(),
            num_sms: self.num_sms(),
            kernel: &kernel,
        };
        let mut bufs = Buffers {
            sinks: sinks_ptr,
            ..Buffers::contiguous(params, ptrs, [total_q, total_k])
        };
        if let (Some((_, pg)), Some((table, _))) = (pages, &_table_guard) {
            let pool =
                Strides::contiguous(Layout::Bshd, pg.page_size, params.heads_kv, params.head_dim);
            bufs.strides[1] = pool;
            bufs.strides[2] = pool;
            bufs.paged = Some(VarlenPages {
                block_table: *table,
                pages: pg,
                left_padded: false,
            });
        }
        // SAFETY: the buffers' lengths were checked against the pack's totals (a paged cache's
        // pools and table against its pages), the metadata's against the batch, their alignment
        // just now; the workspace is this call's own (freed in stream order).
        unsafe { launch_device_list(&target, params, bufs, meta, ws_ptr) }
    }

    /// [`Context::attention_varlen`] with `cu_seqlens` already on the host (checked; the work
    /// list built on the host, no synchronisation).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_host<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        cu_seqlens_q: &[i32],
        cu_seqlens_k: &[i32],
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        self.attention_varlen_host_with_sinks(
            params,
            q,
            k,
            v,
            [cu_seqlens_q, cu_seqlens_k],
            None,
            out,
            lse,
        )
    }

    /// [`Context::attention_varlen_host`] with the window, softcap and sinks, as
    /// [`Context::attention_varlen_device_with_sinks`].
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_host_with_sinks<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        [cu_seqlens_q, cu_seqlens_k]: [&[i32]; 2],
        sinks: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let keys = Keys::VarlenHost {
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
        };
        let call = Call {
            sinks,
            ..Call::new(params, q, keys)
        };
        self.run(&call, out, lse)
    }

    /// Varlen with host offsets ([`Keys::VarlenHost`]).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::attention) fn varlen_host<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        [k, v]: [&CudaSlice<T>; 2],
        [cu_seqlens_q, cu_seqlens_k]: [&[i32]; 2],
        sinks: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        validate::check_buffers_dtype(params, T::DTYPE)?;
        let lse_len = lse.as_ref().map(|l| l.len());
        let (total_q, total_k) = check_varlen(
            params,
            cu_seqlens_q,
            cu_seqlens_k,
            q.len(),
            [k.len(), v.len()],
            out.len(),
            lse_len,
        )?;
        let stream = self.stream().clone();
        let (sinks_ptr, _g) = sinks_ptr(&stream, params, sinks)?;
        if total_q == 0 {
            return Ok(()); // no query anywhere: nothing to write
        }
        let kernel = self.kernel(variant_for(params))?;
        let tile = kernel.variant.tile();
        let items = work_list(
            cu_seqlens_q,
            cu_seqlens_k,
            tile.block_m,
            tile.block_n,
            params.causal,
        );
        let (ptrs, _guards) = packed_ptrs(&stream, q, k, v, out, lse)?;
        let target = Target {
            stream: stream.cu_stream(),
            num_sms: self.num_sms(),
            kernel: &kernel,
        };
        let bufs = Buffers {
            sinks: sinks_ptr,
            ..Buffers::contiguous(params, ptrs, [total_q, total_k])
        };
        // SAFETY: the buffers' lengths were checked against the pack's totals above, their
        // alignment just now.
        unsafe { launch_host_list(&target, params, bufs, &items) }
    }

    /// The device-built work list of a call (header and items of each launch, as the kernel
    /// reads them): what [`Context::attention_varlen_device`] would launch, for tests.
    pub fn varlen_device_work_list(
        &self,
        params: &AttentionParams,
        cu_seqlens_q: &CudaSlice<i32>,
        cu_seqlens_k: &CudaSlice<i32>,
        seqused_k: Option<&CudaSlice<i32>>,
        totals: [usize; 2],
    ) -> Result<Vec<Vec<WorkItem>>> {
        let kernel = self.kernel(variant_for(params))?;
        let (build, _) = build_of(&kernel)?;
        let (tiles, chunks) = device_chunks(params);
        let stream = self.stream().clone();
        let ws = self.alloc::<i32>((chunks * VARLEN_SLOTS * 4).max(4))?;
        let mut a = [
            cu_seqlens_q.device_ptr(&stream).0,
            cu_seqlens_k.device_ptr(&stream).0,
            opt_ptr(&stream, seqused_k),
            0,
            ws.device_ptr(&stream).0,
        ];
        let mut n = [
            params.batch as i32,
            tiles as i32,
            totals[0] as i32,
            totals[1] as i32,
            chunks as i32,
        ];
        let mut args: Vec<*mut std::ffi::c_void> = a
            .iter_mut()
            .map(|x| x as *mut u64 as *mut _)
            .chain(n.iter_mut().map(|x| x as *mut i32 as *mut _))
            .collect();
        // SAFETY: the builder reads batch + 1 (batch) i32s of the metadata and writes `chunks`
        // lists into `ws`, which holds them.
        unsafe {
            cudarc::driver::result::launch_kernel(
                build.cu_function(),
                (1, 1, 1),
                (BUILD_THREADS, 1, 1),
                0,
                stream.cu_stream(),
                &mut args,
            )?;
        }
        let flat = self.download(&ws)?;
        Ok((0..chunks)
            .map(|c| {
                let e = &flat[c * VARLEN_SLOTS * 4..(c + 1) * VARLEN_SLOTS * 4];
                let n = e[0] as usize;
                (1..=n)
                    .map(|i| WorkItem {
                        q_start: e[4 * i],
                        rows: e[4 * i + 1],
                        k_start: e[4 * i + 2],
                        len_k: e[4 * i + 3],
                    })
                    .collect()
            })
            .collect())
    }
}

/// A metadata array's element count against the batch.
/// A paged cache's pools (`kv_len` elements each) and block table (`table_len` entries) against
/// its pages and the call's capacity; returns the element counts of the virtual pack's K and V
/// (`batch · capacity` rows), which the varlen shape check takes.
fn check_pools(
    params: &AttentionParams,
    kv_len: [usize; 2],
    table_len: usize,
    pages: &crate::spec::Pages,
) -> Result<[usize; 2]> {
    validate::check_pages(params, pages)?;
    let pool = pages.pool_len(params);
    for (name, len) in [("k", kv_len[0]), ("v", kv_len[1])] {
        if len != pool {
            return Err(Error::invalid(
                name,
                format!(
                    "a pool of {} pages of {} rows holds {pool} elements, got {len}",
                    pages.num_pages, pages.page_size
                ),
            ));
        }
    }
    check_meta_len(
        "block_table",
        table_len,
        params.batch * (params.seqlen_k / pages.page_size),
    )?;
    let rows = params.batch * params.seqlen_k;
    Ok([rows * params.heads_kv * params.head_dim; 2])
}

pub(crate) fn check_meta_len(arg: &'static str, len: usize, want: usize) -> Result<()> {
    if len != want {
        return Err(Error::invalid(
            arg,
            format!("has {len} entries, a batch of sequences needs {want}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::validate::rule_of;

    /// A paged pack loads TMA boxes only where pages are powers of two of at least 16 rows and
    /// no sequence starts inside a box; every shape's paged varlen build is a shipped one.
    #[test]
    fn paged_packs_take_boxes_or_the_gather_and_a_shipped_build() {
        let paged = |page_size, left_padded| VarlenPages {
            block_table: 0x1000,
            pages: crate::spec::Pages {
                page_size,
                num_pages: 64,
            },
            left_padded,
        };
        for (page, left, gather) in [
            (16, false, false),
            (64, false, false),
            (256, false, false),
            (64, true, true),
            (1, false, true),
            (7, false, true),
            (48, false, true),
            (8, false, true),
        ] {
            assert_eq!(
                paged(page, left).gather(),
                gather,
                "page {page} left {left}"
            );
        }
        assert_eq!(paged(16, false).box_rows(128), 16);
        assert_eq!(paged(256, false).box_rows(64), 64);
        let shipped = crate::kernels::shipped_variants();
        for dtype in [crate::spec::DType::F16, crate::spec::DType::Bf16] {
            for d in crate::spec::SUPPORTED_HEAD_DIMS {
                for causal in [false, true] {
                    for softcap in [0.0, 30.0] {
                        let p = AttentionParams::new(2, 4, 300, d)
                            .dtype(dtype)
                            .causal(causal)
                            .softcap(softcap);
                        let v = crate::kernels::select::varlen_paged(&p);
                        assert!(v.paged && v.varlen && shipped.contains(&v), "{}", v.name());
                        assert_eq!(v.tile(), variant_for(&p).tile(), "{}", v.name());
                        assert!(
                            v.name().ends_with("_varlen_paged")
                                || v.name().ends_with("_varlen_paged_softcap")
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn accepts_a_good_pack_with_empty_sequences() {
        check_cu_seqlens("cu_seqlens_q", &[0, 1, 1, 18, 4115], 4, 4115, 4097).unwrap();
        check_cu_seqlens("cu_seqlens_q", &[0], 0, 0, 1).unwrap();
    }

    #[test]
    fn rejects_each_bad_cu_seqlens() {
        let bad: [(&[i32], usize, usize, usize, &str); 6] = [
            (&[0, 5, 3], 2, 3, 10, "non-decreasing"),
            (&[0, 5, 9], 2, 10, 10, "last entry is 9"),
            (&[0, 5], 2, 5, 10, "batch + 1 = 3"),
            (&[0, 5, 9, 12], 2, 12, 10, "batch + 1 = 3"),
            (&[1, 5, 9], 2, 9, 10, "start at 0"),
            (&[0, 5, 20], 2, 20, 10, "more than max_seqlen"),
        ];
        for (cu, batch, total, max, want) in bad {
            let (arg, rule) =
                rule_of(check_cu_seqlens("cu_seqlens_k", cu, batch, total, max).unwrap_err());
            assert_eq!(arg, "cu_seqlens_k");
            assert!(rule.contains(want), "{cu:?}: {rule}");
        }
    }

    #[test]
    fn check_varlen_names_the_argument() {
        let p = AttentionParams::new(2, 2, 8, 64);
        let row = 2 * 64;
        let cu = [0, 3, 8];
        assert_eq!(
            check_varlen(&p, &cu, &cu, 8 * row, [8 * row, 8 * row], 8 * row, Some(16)).unwrap(),
            (8, 8)
        );
        let err = |r: Result<(usize, usize)>| rule_of(r.unwrap_err()).0;
        assert_eq!(
            err(check_varlen(
                &p,
                &[0, 3, 7],
                &cu,
                8 * row,
                [8 * row; 2],
                8 * row,
                None
            )),
            "cu_seqlens_q"
        );
        assert_eq!(
            err(check_varlen(
                &p,
                &cu,
                &[0, 9, 8],
                8 * row,
                [8 * row; 2],
                8 * row,
                None
            )),
            "cu_seqlens_k"
        );
        assert_eq!(
            err(check_varlen(
                &p,
                &cu,
                &cu,
                8 * row + 1,
                [8 * row; 2],
                8 * row,
                None
            )),
            "q"
        );
        assert_eq!(
            err(check_varlen(
                &p,
                &cu,
                &cu,
                8 * row,
                [8 * row, 7 * row],
                8 * row,
                None
            )),
            "v"
        );
        assert_eq!(
            err(check_varlen(
                &p,
                &cu,
                &cu,
                8 * row,
                [8 * row; 2],
                7 * row,
                None
            )),
            "out"
        );
        assert_eq!(
            err(check_varlen(
                &p,
                &cu,
                &cu,
                8 * row,
                [8 * row; 2],
                8 * row,
                Some(8)
            )),
            "lse"
        );
        let bhsd = p.clone().layout(Layout::Bhsd);
        assert_eq!(
            err(check_varlen(
                &bhsd,
                &cu,
                &cu,
                8 * row,
                [8 * row; 2],
                8 * row,
                None
            )),
            "layout"
        );
    }

    #[test]
    fn work_list_covers_every_tile_sequence_by_sequence_heaviest_first() {
        // Lengths 1, 0, 300, 129 (queries) over 5, 0, 300, 1 keys, 128-row tiles.
        let cu_q = [0, 1, 1, 301, 430];
        let cu_k = [0, 5, 5, 305, 306];
        let items = work_list(&cu_q, &cu_k, 128, 128, true);
        assert_eq!(items.len(), 1 + 3 + 2);
        let w: Vec<i64> = items
            .iter()
            .map(|it| kv_blocks(it, 128, 128, true))
            .collect();
        // The 300-query sequence (its tiles see 3, 2, 1 blocks), then the 1-query one (1), then
        // the 129-query one (its last tile sees the one key: 1, then 0); each sequence's tiles
        // last query block first.
        assert_eq!(w, [3, 2, 1, 1, 1, 0]);
        let starts: Vec<i32> = items.iter().map(|it| it.q_start).collect();
        assert_eq!(starts, [257, 129, 1, 0, 429, 301]);
        // The last tile of the 300-query sequence: rows 256..300, all 300 keys (3 blocks).
        assert_eq!(
            items[0],
            WorkItem {
                q_start: 257,
                rows: 44,
                k_start: 5,
                len_k: 300
            }
        );
        // Causal with 129 queries over 1 key: the first tile sees nothing (bottom-right).
        let first = WorkItem {
            q_start: 301,
            rows: 129,
            k_start: 305,
            len_k: 1,
        };
        assert_eq!(kv_blocks(&first, 128, 128, true), 0);
        assert_eq!(kv_blocks(&first, 128, 128, false), 1);
    }
}
