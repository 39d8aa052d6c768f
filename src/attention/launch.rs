//! Loading a kernel variant and launching it: the parameter block, grid, shared memory.

use super::decode::{self, CombineParams, DecodeSchedule, COMBINE_THREADS};
use super::device::Context;
pub use super::device::LoadedKernel;
use super::tensor_map;
use crate::abi::{FastDiv, KernelParams};
use crate::error::{Error, Result};
use crate::kernels::{KernelBuild, TestBuild, Tile, Variant};
use crate::knobs::PdlMode;
use crate::spec::AttentionParams;
pub use crate::spec::Lengths;
use crate::spec::Strides;
use cudarc::driver::{sys, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use std::sync::{Arc, Mutex};

/// Variable-length prefill: packed sequences, one launch.
pub mod varlen;

/// The kernel's window and softcap fields for `p` over `seqlen_q` query and `seqlen_k` key rows
/// (a varlen pack's totals): (window_left, window_right, softcap_in, softcap_out). An unbounded
/// side becomes Sq + Sk (no row's distance to a key reaches it), capped so the kernel's i32
/// differences cannot overflow.
pub(crate) fn feature_fields(
    p: &AttentionParams,
    seqlen_q: usize,
    seqlen_k: usize,
) -> (i32, i32, f32, f32) {
    let unbounded = (seqlen_q + seqlen_k).min(1 << 29);
    let w = p.effective_window();
    let side = |x: Option<usize>| x.map_or(unbounded, |v| v.min(unbounded)) as i32;
    let scale = p.softmax_scale();
    let (cap_in, cap_out) = if p.softcap > 0.0 {
        (scale / p.softcap, p.softcap / scale)
    } else {
        (0.0, 0.0)
    };
    (side(w.left), side(w.right), cap_in, cap_out)
}

/// How the persistent grid walks the query tiles (kernels/fc_scheduler.cuh): the work units and
/// the number of CTAs. A function of the shape and the device's SM count only; it decides which
/// CTA computes a tile, never what the tile computes, so output bits stay batch-invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Query tiles per (batch, head).
    pub m_blocks: i32,
    /// Causal with more tiles than SMs: a unit pairs tile m_blocks−1−j with tile j, so every unit
    /// visits about the same number of key blocks and a static round-robin balances the SMs.
    pub pair_tiles: bool,
    /// Work units per (batch, head) and in all.
    pub units_per_head: i32,
    pub units: i32,
    /// CTAs launched: one per SM at most (each takes every gridDim-th unit); split mode launches
    /// one cluster per unit.
    pub ctas: u32,
    /// The dynamic order's sections, where a launch may take it: causal prefill with at least as
    /// many tile pairs as SMs (the grid is then full in either order).
    pub dynamic: Option<DynamicOrder>,
}

/// Whether a prefill launch's epilogue stores O with TMA (kernels/fc_epilogue.cuh, `kStoreTma`:
/// tiles with two Q buffers and 128-byte rows, no key split) and O allows it (address and strides
/// 16-byte aligned). A public choice: the build and O's layout.
pub(super) fn stores_o_by_tma(p: &AttentionParams, tile: &Tile, o: u64, o_st: Strides) -> bool {
    let build = tile.split == 1
        && tile.q_buffers == 2
        && tensor_map::swizzle_elems(p.head_dim) == tensor_map::SWIZZLE_ELEMS;
    let elem = p.dtype.size() as i64;
    let aligned = o % 16 == 0
        && [o_st.batch, o_st.seq, o_st.head]
            .iter()
            .all(|s| (s * elem) % 16 == 0);
    build && aligned
}

/// The dynamic order (kernels/fc_scheduler.cuh): one unit per tile, taken from a counter,
/// heaviest first within sections of `section_heads` (batch, head) pairs, so the light tiles fill
/// the tail where the static pairs leave the last wave part-empty (a block-count model puts
/// static pairs ~3% over the ideal makespan, this order 0.0–0.5%). Public: shapes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicOrder {
    pub units: i32,
    pub section_heads: i32,
}

impl DynamicOrder {
    /// The counter buffer's u32 words for a grid of `ctas`: the next ticket, the CTAs done, and
    /// two hand-over slots per CTA.
    pub fn counter_words(ctas: u32) -> usize {
        2 + 2 * ctas as usize
    }

    /// Of the divisors of batch · heads_q, the largest whose section's K/V (its K/V heads) fits
    /// `L2_SHARE` bytes: the CTAs at work share a section's keys in L2.
    fn new(params: &AttentionParams, m_blocks: usize) -> DynamicOrder {
        const L2_SHARE: usize = 24 << 20;
        let pairs = params.batch * params.heads_q;
        let group = (params.heads_q / params.heads_kv.max(1)).max(1);
        let kv_head_bytes = params.seqlen_k * params.head_dim * 2 * 2;
        let fits = |s: usize| s.div_ceil(group) * kv_head_bytes <= L2_SHARE;
        let section_heads = (1..=pairs)
            .filter(|&s| pairs % s == 0 && (s == 1 || fits(s)))
            .max()
            .unwrap_or(1);
        DynamicOrder {
            units: (pairs * m_blocks) as i32,
            section_heads: section_heads as i32,
        }
    }
}

impl Schedule {
    /// `causal`: the build's mask (only causal builds walk two tiles per unit).
    pub fn new(
        params: &AttentionParams,
        tile: &Tile,
        causal: bool,
        num_sms: usize,
    ) -> Result<Schedule> {
        let m_blocks = params.seqlen_q.div_ceil(tile.block_m);
        let tiles = m_blocks as u128 * params.heads_q as u128 * params.batch as u128;
        let pair_tiles = causal && tile.split == 1 && tiles > num_sms as u128;
        let units_per_head = if pair_tiles {
            m_blocks.div_ceil(2)
        } else {
            m_blocks
        };
        let units = units_per_head as u128 * params.heads_q as u128 * params.batch as u128;
        let ctas = if tile.split > 1 {
            units * tile.split as u128
        } else {
            units.min(num_sms.max(1) as u128)
        };
        if units > i32::MAX as u128 || ctas > i32::MAX as u128 {
            return Err(Error::invalid(
                "batch",
                "too many query tiles: batch · heads · ceil(seqlen_q / 128) must fit in an i32",
            ));
        }
        // Measured (performance journal, the dynamic tile order): 2–6% faster at d64 causal from
        // S = 1k, 1–2% at d128 and d256, 2–3% slower at 4 tiles per head (S = 512). Only builds
        // with the order compiled in take it (Variant::dynamic_order; Plan::new filters).
        let dynamic = (pair_tiles && units >= num_sms as u128 && m_blocks >= 8)
            .then(|| DynamicOrder::new(params, m_blocks));
        Ok(Schedule {
            m_blocks: m_blocks as i32,
            pair_tiles,
            units_per_head: units_per_head as i32,
            units: units as i32,
            ctas: ctas as u32,
            dynamic,
        })
    }
}

/// When the forward kernel is launched as a programmatic dependent of the previous kernel in its
/// stream ([`Plan::launch_on`]; the performance journal). `FLASHCORE_PDL` (read once per
/// process): `0` never, `1` every eligible launch, unset (or anything else) the shipped rule —
/// only grids that leave SMs idle. There the next call's CTAs park on the idle SMs under this
/// call and the launch gap shrinks (−0.5 to −0.8 µs, 6–8% at the latency shapes); a grid that
/// fills every SM gains nothing measurable (its successor's CTAs can only take an SM ours leave)
/// and its A/B was within the run-to-run noise of ±3%, so it keeps the plain launch.
fn programmatic_launch(build: KernelBuild, ctas: u32, num_sms: usize) -> bool {
    let mode = crate::knobs::pdl();
    pdl_rule(mode, build, ctas, num_sms)
}

fn pdl_rule(mode: PdlMode, build: KernelBuild, ctas: u32, num_sms: usize) -> bool {
    pdl_eligible(build)
        && match mode {
            PdlMode::Never => false,
            PdlMode::Always => true,
            PdlMode::SmallGrids => (ctas as usize) < num_sms,
        }
}

/// The builds [`programmatic_launch`] may apply to: shipped prefill builds (dense and
/// secret-length; varlen launches from its own module). Not decode and KV-cache builds (their
/// main kernel signals its combine at the very top; not measured with the attribute yet), nor
/// the leakage test's builds, whose timings assume a plain launch.
fn pdl_eligible(build: KernelBuild) -> bool {
    !build.variant.decode && build.test.is_shipped()
}

/// Buffers and element strides (q, k, v, o) a parameter block was built for.
type LaunchKey = ([u64; 11], [Strides; 4]);

/// Which of a plan's tensor maps: q's, or a K/V one (K and V maps of a buffer are the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum MapOperand {
    Q,
    Kv,
    O,
}

/// Tensor maps kept per plan, at most this many (emptied when full): the K and V caches of a
/// model's every layer and a few q buffers, ~80 KB.
const MAX_MAPS: usize = 512;

/// The tensor maps a plan has encoded, by operand and buffer (address, element strides). A map
/// is a function of those and of the plan's shape, so one encoded for a buffer holds for every
/// later call on it — a decode loop's per-layer caches, the q buffers its allocator hands out
/// again — and encoding one (a driver call) is most of a parameter block's host time.
struct MapCache<M> {
    maps: std::collections::HashMap<(MapOperand, u64, Strides), M>,
}

impl<M: Copy> MapCache<M> {
    fn new() -> Self {
        MapCache {
            maps: Default::default(),
        }
    }

    /// The map of `operand` over `ptr` by `strides`: the kept one, else `encode`'s (kept).
    fn get_or_encode(
        &mut self,
        operand: MapOperand,
        ptr: u64,
        strides: Strides,
        encode: impl FnOnce() -> Result<M>,
    ) -> Result<M> {
        let key = (operand, ptr, strides);
        if let Some(m) = self.maps.get(&key) {
            return Ok(*m);
        }
        let m = encode()?;
        if self.maps.len() >= MAX_MAPS {
            self.maps.clear();
        }
        self.maps.insert(key, m);
        Ok(m)
    }
}

/// A plan's launch state: the parameter block of the last buffers seen, and the maps encoded.
struct LaunchCache {
    last: Option<(LaunchKey, Box<KernelParams>)>,
    maps: MapCache<sys::CUtensorMap>,
}

/// Everything one shape needs to launch, prepared once: the loaded kernel, grid, and the
/// parameter block of the last buffers seen (rebuilt only when the pointers change), so
/// repeated launches on the same buffers do no host work but the launch itself.
pub struct Plan {
    params: AttentionParams,
    kernel: Arc<LoadedKernel>,
    stream: Arc<CudaStream>,
    tile: Tile,
    grid: (u32, u32, u32),
    schedule: Schedule,
    /// Decode mode's grid (`Some` for decode variants).
    decode: Option<DecodeSchedule>,
    /// The partials' workspace for launches that bring none (the Rust API, on the context's
    /// own stream). Allocated with the plan — never at the first launch, which may be inside a
    /// stream capture, where an allocation becomes a graph node that blocks relaunching the
    /// graph — and not at all for plans of external calls, which bring their own.
    own_workspace: Option<CudaSlice<u8>>,
    /// The dynamic order's counter for launches on the context's own stream (zero, and left zero
    /// by every launch), where the schedule and the build allow that order.
    own_counter: Option<CudaSlice<u32>>,
    lengths: Lengths,
    /// Launched as a programmatic dependent ([`programmatic_launch`]).
    programmatic: bool,
    cached: Mutex<LaunchCache>,
}

impl Plan {
    pub(crate) fn new(
        ctx: &Context,
        params: AttentionParams,
        lengths: Lengths,
        build: TestBuild,
        own_workspace: bool,
    ) -> Result<Plan> {
        let build = crate::kernels::select::forward(&params, lengths, build, ctx.num_sms())?;
        let variant = build.variant;
        let kernel = ctx.kernel(build)?;
        let tile = variant.tile();
        let schedule = Schedule::new(&params, &tile, variant.causal, ctx.num_sms())?;
        let decode = if variant.decode {
            Some(DecodeSchedule::new(&params, &tile, ctx.num_sms(), lengths)?)
        } else {
            None
        };
        let grid = (decode.map_or(schedule.ctas, |d| d.ctas), 1, 1);
        let ws_bytes = decode.map_or(0, |d| d.workspace_bytes(&params));
        let own_buffers = own_workspace;
        let own_workspace = if own_buffers && ws_bytes > 0 {
            Some(ctx.alloc::<u8>(ws_bytes)?)
        } else {
            None
        };
        let schedule = Schedule {
            dynamic: schedule
                .dynamic
                .filter(|_| variant.dynamic_order() && decode.is_none()),
            ..schedule
        };
        let own_counter = if own_buffers && schedule.dynamic.is_some() {
            Some(ctx.alloc::<u32>(DynamicOrder::counter_words(grid.0))?)
        } else {
            None
        };
        Ok(Plan {
            params,
            kernel,
            stream: ctx.stream().clone(),
            tile,
            grid,
            schedule,
            decode,
            own_workspace,
            own_counter,
            lengths,
            programmatic: programmatic_launch(build, grid.0, ctx.num_sms()),
            cached: Mutex::new(LaunchCache {
                last: None,
                maps: MapCache::new(),
            }),
        })
    }

    pub fn params(&self) -> &AttentionParams {
        &self.params
    }

    /// Whether launches are programmatic dependents of the previous kernel in the stream.
    pub fn programmatic(&self) -> bool {
        self.programmatic
    }

    /// CTAs per launch (the persistent grid's size).
    pub fn ctas(&self) -> u32 {
        self.grid.0
    }

    /// The variant this plan launches.
    pub fn variant(&self) -> Variant {
        self.kernel.variant
    }

    /// The build launched: the variant, or one of the timing test's builds of it.
    pub fn compiled(&self) -> KernelBuild {
        self.kernel.compiled
    }

    /// Device address and size in bytes of a global (`__constant__` or `__device__`) of the
    /// plan's module: how the leakage test's cycle timer is told where to write.
    pub fn module_global(&self, name: &str) -> Result<(u64, usize)> {
        use cudarc::driver::DevicePtr;
        let view = self.kernel.module.get_global(name, &self.stream)?;
        let len = view.len();
        let ptr = view.device_ptr(&self.stream).0;
        Ok((ptr, len))
    }

    /// Whether this plan reads per-sequence lengths (see [`Plan::launch_raw_with_lengths`]).
    pub fn secret_len(&self) -> bool {
        self.lengths != Lengths::None
    }

    /// What this plan's lengths buffer means.
    pub fn lengths(&self) -> Lengths {
        self.lengths
    }

    /// Bytes of workspace each launch needs (decode mode's split partials; 0 otherwise).
    pub fn workspace_bytes(&self) -> usize {
        self.decode.map_or(0, |d| d.workspace_bytes(&self.params))
    }

    /// The parameter block for `key`; `maps` are the q, k, v tensor maps when an earlier block of
    /// the same q, k, v (pointers and strides) already encoded them.
    fn build(
        &self,
        (ptrs, strides): LaunchKey,
        maps: &mut MapCache<sys::CUtensorMap>,
    ) -> Result<KernelParams> {
        let p = &self.params;
        let [q, k, v, o, lse, lens, ws, table, starts, sinks, counter] = ptrs;
        let [q_st, k_st, v_st, o_st] = strides;
        let (ws_o_ptr, ws_ml_ptr) = self.decode.map_or((0, 0), |d| d.workspace_parts(p, ws));
        let [q_map, k_map, v_map] = self.encode_maps([q, k, v], [q_st, k_st, v_st], maps)?;
        let pages = self.lengths.pages();
        let box_rows = self.kv_box_rows();
        let [sb, ss, sh] = o_st.as_array();
        let scale = p.softmax_scale();
        let (window_left, window_right, softcap_in, softcap_out) =
            feature_fields(p, p.seqlen_q, p.seqlen_k);
        let o_map = self.encode_o_map(o, o_st, maps);
        // The dynamic order: one unit per tile from the counter (same grid: see Schedule).
        let dynamic = self.schedule.dynamic.filter(|_| counter != 0);
        let (units_per_head, units, pair_tiles) = match dynamic {
            Some(d) => (self.schedule.m_blocks, d.units, false),
            None => (
                self.schedule.units_per_head,
                self.schedule.units,
                self.schedule.pair_tiles,
            ),
        };
        let section_heads = dynamic.map_or(0, |d| d.section_heads);
        let sec = FastDiv::new(section_heads.max(1) as u32);
        let sec_units = FastDiv::new((section_heads.max(1) * self.schedule.m_blocks.max(1)) as u32);
        let uph = FastDiv::new(units_per_head.max(1) as u32);
        let hq = FastDiv::new(p.heads_q as u32);
        Ok(KernelParams {
            q_map,
            k_map,
            v_map,
            o_ptr: o,
            lse_ptr: lse,
            lens_ptr: lens,
            q_ptr_for_control: q,
            o_stride_b: sb,
            o_stride_s: ss,
            o_stride_h: sh,
            seqlen_q: p.seqlen_q as i32,
            seqlen_k: p.seqlen_k as i32,
            heads_q: p.heads_q as i32,
            group: (p.heads_q / p.heads_kv) as i32,
            scale_log2: scale * std::f32::consts::LOG2_E,
            scale,
            num_m_blocks: self
                .decode
                .map_or(self.schedule.m_blocks, |d| d.m_blocks as i32),
            units_per_head,
            num_units: self.decode.map_or(units, |d| d.units as i32),
            pair_tiles: (pair_tiles && self.decode.is_none()) as i32,
            ws_o_ptr,
            ws_ml_ptr,
            pack: self.decode.map_or(1, |d| d.pack as i32),
            pack_shift: self.decode.map_or(0, |d| d.pack.trailing_zeros() as i32),
            split_blocks: self.decode.map_or(0, |d| d.split_blocks as i32),
            num_splits: self.decode.map_or(1, |d| d.num_splits as i32),
            table_ptr: if pages.is_some() { table } else { 0 },
            table_stride: pages.map_or(0, |pg| (p.seqlen_k / pg.page_size) as i32),
            num_pages: pages.map_or(0, |pg| pg.num_pages as i32),
            page_shift: pages.map_or(0, |pg| pg.page_size.trailing_zeros() as i32),
            box_rows: box_rows as i32,
            starts_ptr: if matches!(self.lengths, Lengths::KvCache { .. }) {
                starts
            } else {
                0
            },
            sinks_ptr: sinks,
            window_left,
            window_right,
            softcap_in,
            softcap_out,
            units_per_head_mul: uph.mul,
            units_per_head_shift: uph.shift,
            heads_q_mul: hq.mul,
            heads_q_shift: hq.shift,
            o_tma: o_map.is_some() as i32,
            // SAFETY: a tensor map is plain bytes; the kernel reads it only when o_tma is 1.
            o_map: o_map.unwrap_or(unsafe { std::mem::zeroed() }),
            tile_counter: if dynamic.is_some() { counter } else { 0 },
            section_heads,
            section_heads_mul: sec.mul,
            section_heads_shift: sec.shift,
            section_units_mul: sec_units.mul,
            section_units_shift: sec_units.shift,
            // Any page size: the gathered load's fields (fc_producer.cuh), zero unless paged.
            page_size: pages.map_or(0, |pg| pg.page_size as i32),
            page_mul: pages.map_or(0, |pg| pg.divisor().0),
            page_div_shift: pages.map_or(0, |pg| pg.divisor().1),
            gather: pages.is_some_and(|pg| !pg.tma_boxes()) as i32,
            k_ptr: if pages.is_some() { k } else { 0 },
            v_ptr: if pages.is_some() { v } else { 0 },
            k_stride: if pages.is_some() {
                k_st.as_array()
            } else {
                [0; 3]
            },
            v_stride: if pages.is_some() {
                v_st.as_array()
            } else {
                [0; 3]
            },
        })
    }

    /// O's tensor map (box: one warp's 16 rows) where the epilogue stores O with TMA
    /// ([`stores_o_by_tma`]; not in decode builds); `None` keeps the stores from registers.
    fn encode_o_map(
        &self,
        o: u64,
        o_st: Strides,
        maps: &mut MapCache<sys::CUtensorMap>,
    ) -> Option<sys::CUtensorMap> {
        let p = &self.params;
        if !(self.decode.is_none() && stores_o_by_tma(p, &self.tile, o, o_st)) {
            return None;
        }
        maps.get_or_encode(MapOperand::O, o, o_st, || {
            tensor_map::encode(
                o, p.dtype, o_st, p.batch, p.seqlen_q, p.heads_q, p.head_dim, 16,
            )
        })
        .ok()
    }

    /// The q, k, v tensor maps (most of a parameter block's host time: three driver calls),
    /// each taken from `maps` where this plan encoded it before, else encoded and kept there.
    fn encode_maps(
        &self,
        [q, k, v]: [u64; 3],
        [q_st, k_st, v_st]: [Strides; 3],
        maps: &mut MapCache<sys::CUtensorMap>,
    ) -> Result<[sys::CUtensorMap; 3]> {
        let p = &self.params;
        let rows = self.tile.block_m as u32;
        let q_map = maps.get_or_encode(MapOperand::Q, q, q_st, || match self.decode {
            Some(d) => tensor_map::encode_packed(
                q,
                p.dtype,
                q_st,
                p.batch,
                p.seqlen_q,
                p.heads_q,
                p.head_dim,
                d.pack as u32,
                rows,
            ),
            None => tensor_map::encode(
                q, p.dtype, q_st, p.batch, p.seqlen_q, p.heads_q, p.head_dim, rows,
            ),
        })?;
        // A paged cache's K/V maps span the pool, one box per page a block spans.
        let (kv_batch, kv_seq) = match self.lengths.pages() {
            Some(pg) => (pg.num_pages, pg.page_size),
            None => (p.batch, p.seqlen_k),
        };
        let box_rows = self.kv_box_rows();
        // Decode streams each K/V byte once: 128-byte promotion there (knobs::decode_kv_l2).
        let l2 = match self.decode {
            Some(_) => crate::knobs::decode_kv_l2(),
            None => crate::knobs::L2Promotion::B256,
        };
        let mut kv = |ptr, st| {
            maps.get_or_encode(MapOperand::Kv, ptr, st, || {
                tensor_map::encode_with_l2(
                    ptr,
                    p.dtype,
                    st,
                    [kv_batch, kv_seq, p.heads_kv, p.head_dim],
                    box_rows,
                    l2,
                )
            })
        };
        Ok([q_map, kv(k, k_st)?, kv(v, v_st)?])
    }

    /// Rows per K/V TMA box: a whole block, or a page when pages are shorter.
    fn kv_box_rows(&self) -> u32 {
        let keys = self.tile.block_n as u32;
        self.lengths
            .pages()
            .map_or(keys, |pg| keys.min(pg.page_size as u32))
    }

    /// A paged plan's launch needs its block table; a contiguous plan's none.
    fn check_table(&self, table: u64) -> Result<()> {
        if self.lengths.pages().is_some() != (table != 0) {
            return Err(Error::invalid(
                "block_table",
                "a paged plan needs its block table, a contiguous one none",
            ));
        }
        Ok(())
    }

    /// Enqueues the kernel on the context's stream.
    ///
    /// # Safety
    /// The pointers must be device allocations on this context holding `params().q_len()` (q, o),
    /// `kv_len()` (k, v) elements of the plan's dtype and, unless 0, `lse_len()` f32s (lse), each
    /// 16-byte aligned, and must stay alive until the kernel finishes.
    pub unsafe fn launch_raw(&self, q: u64, k: u64, v: u64, o: u64, lse: u64) -> Result<()> {
        if self.secret_len() {
            return Err(Error::invalid(
                "lengths",
                "this plan is in secret-length mode: use launch_raw_with_lengths",
            ));
        }
        self.launch(q, k, v, o, lse, [0; 4])
    }

    /// As [`Plan::launch_raw`] or (in a lengths mode) [`Plan::launch_raw_with_lengths`] /
    /// [`Plan::launch_raw_kv_cache`], plus `sinks`: learnable attention sinks, fp32 `[heads_q]`
    /// logits (gpt-oss), each adding `exp(sink)` to its head's softmax denominators; 0 for none.
    /// `extra` = (lengths, block table, KV-cache starts), 0 where absent.
    ///
    /// # Safety
    /// As for the launch this mode needs; `sinks`, unless 0, must hold `params().heads_q` f32s.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw_with_sinks(
        &self,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        lse: u64,
        [lens, table, starts]: [u64; 3],
        sinks: u64,
    ) -> Result<()> {
        if self.secret_len() != (lens != 0) {
            return Err(Error::invalid(
                "lengths",
                "a lengths buffer goes with a lengths plan (and only there)",
            ));
        }
        self.check_table(table)?;
        self.launch(q, k, v, o, lse, [lens, table, starts, sinks])
    }

    /// Secret-length mode: as [`Plan::launch_raw`], plus `lens`, a device buffer of `batch` i32
    /// true lengths (each clamped to [0, padded length] on the device); for a KV-cache plan
    /// ([`Lengths::KvCache`]) each sequence's key count in the cache (clamped to [0, capacity]).
    ///
    /// # Safety
    /// As for [`Plan::launch_raw`]; `lens` must hold `params().batch` i32s.
    pub unsafe fn launch_raw_with_lengths(
        &self,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        lse: u64,
        lens: u64,
    ) -> Result<()> {
        if !self.secret_len() || lens == 0 {
            return Err(Error::invalid(
                "lengths",
                "needs a plan made by Context::plan_secret_len and a lengths buffer",
            ));
        }
        if self.lengths.pages().is_some() {
            return Err(Error::invalid(
                "block_table",
                "this plan reads a paged cache: use launch_raw_kv_cache",
            ));
        }
        self.launch(q, k, v, o, lse, [lens, 0, 0, 0])
    }

    /// Any KV-cache plan: `lens` the key counts, `table` the block table of a paged plan (0 for
    /// a contiguous one), `starts` each sequence's first key (i32 `[batch]`, flash-attn's
    /// `cache_leftpad`: keys before it are masked; clamped into [0, capacity] on the device) or 0.
    /// A paged plan's `k` and `v` are the page pools (`[num_pages, page_size, heads_kv,
    /// head_dim]`, contiguous) and `table` its block table (`[batch, seqlen_k / page_size]` i32
    /// page indices; entries are clamped into the pool on the device).
    ///
    /// # Safety
    /// As for [`Plan::launch_raw_with_lengths`], with a paged plan's `k` and `v` holding the pools
    /// and `table` the table's `batch · seqlen_k / page_size` i32s; `starts`, unless 0, must hold
    /// `params().batch` i32s.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw_kv_cache(
        &self,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        lse: u64,
        lens: u64,
        table: u64,
        starts: u64,
    ) -> Result<()> {
        if !matches!(self.lengths, Lengths::KvCache { .. }) || lens == 0 {
            return Err(Error::invalid(
                "lengths",
                "needs a KV-cache plan (Context::plan_kv_cache) and a key-count buffer",
            ));
        }
        self.check_table(table)?;
        self.launch(q, k, v, o, lse, [lens, table, starts, 0])
    }

    unsafe fn launch(
        &self,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        lse: u64,
        [lens, table, starts, sinks]: [u64; 4],
    ) -> Result<()> {
        let p = &self.params;
        let q_st = Strides::contiguous(p.layout, p.seqlen_q, p.heads_q, p.head_dim);
        let kv_st = match self.lengths.pages() {
            Some(pg) => Strides::contiguous(p.layout, pg.page_size, p.heads_kv, p.head_dim),
            None => Strides::contiguous(p.layout, p.seqlen_k, p.heads_kv, p.head_dim),
        };
        let strides = [q_st, kv_st, kv_st, q_st];
        let ws = self
            .own_workspace
            .as_ref()
            .map_or(0, |w| w.device_ptr(&self.stream).0);
        let counter = self
            .own_counter
            .as_ref()
            .map_or(0, |c| c.device_ptr(&self.stream).0);
        self.launch_on(
            [q, k, v, o, lse, lens, ws, table, starts, sinks],
            counter,
            strides,
            self.stream.cu_stream(),
        )
    }

    /// Enqueues the kernel on `stream` for tensors with explicit element strides (q, k, v, o);
    /// `ptrs` = (q, k, v, o, lse, lengths, workspace, block table, KV-cache starts, sinks), 0 for
    /// an absent one.
    ///
    /// # Safety
    /// As for [`Plan::launch_raw`], with each buffer covering what its strides reach, the
    /// workspace [`Plan::workspace_bytes`] long and used by no other launch in flight, and
    /// `stream` a live stream of this plan's context; strides checked by
    /// [`super::external::validate`].
    /// `counter`: the dynamic order's counter (u32 [`DynamicOrder::counter_words`]: its first two
    /// words zero, and left zero by the launch; used by no launch in flight on another stream),
    /// or 0 for the static order.
    pub(crate) unsafe fn launch_on(
        &self,
        ptrs: [u64; 10],
        counter: u64,
        strides: [Strides; 4],
        stream: sys::CUstream,
    ) -> Result<()> {
        let counter = if self.schedule.dynamic.is_some() && !crate::knobs::static_tile_order() {
            counter
        } else {
            0
        };
        if ptrs[9] != 0 && self.lengths == Lengths::SecretPadded {
            return Err(Error::invalid(
                "sinks",
                "are not supported with secret-length prefill yet",
            ));
        }
        if self.lengths.pages().is_some() && ptrs[7] == 0 {
            return Err(Error::invalid(
                "block_table",
                "this plan reads a paged cache and needs its block table",
            ));
        }
        if self.workspace_bytes() > 0 && ptrs[6] == 0 {
            return Err(Error::invalid(
                "workspace",
                "this decode call splits its keys and needs a workspace of Plan::workspace_bytes() bytes",
            ));
        }
        let mut all = [0u64; 11];
        all[..10].copy_from_slice(&ptrs);
        all[10] = counter;
        let key = (all, strides);
        let mut cached = self
            .cached
            .lock()
            .map_err(|_| Error::Other("plan lock poisoned".into()))?;
        let cached = &mut *cached;
        let stale = !matches!(cached.last.as_ref(), Some((k, _)) if *k == key);
        if stale {
            // A fresh output (or LSE, workspace) per call is the usual change, and in decode a
            // fresh q over the same caches, or another layer's caches: each q, k, v map this
            // plan encoded before is taken from `maps`, since encoding them is most of a rebuild.
            cached.last = Some((key, Box::new(self.build(key, &mut cached.maps)?)));
        }
        let block = cached.last.as_mut().map(|(_, b)| b).expect("filled above");
        let mut args: [*mut std::ffi::c_void; 1] =
            [(&mut **block) as *mut KernelParams as *mut std::ffi::c_void];
        // Programmatic dependent launch: the grid may be scheduled while the
        // previous kernel in the stream drains; the kernel waits (`griddepcontrol.wait`) before
        // its first global access, so any predecessor's writes are complete and visible. A
        // non-kernel predecessor (copy, event) orders as usual; in a graph capture the edge
        // becomes a programmatic one.
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: self.grid.0,
            gridDimY: self.grid.1,
            gridDimZ: self.grid.2,
            blockDimX: self.tile.threads() as u32,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: self.kernel.smem_bytes as u32,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: self.programmatic as u32,
        };
        sys::cuLaunchKernelEx(
            &config,
            self.kernel.function.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()?;
        if let (Some(d), Some(combine)) = (self.decode, self.kernel.combine.as_ref()) {
            if d.num_splits > 1 {
                self.launch_combine(block, d, combine, stream)?;
            }
        }
        Ok(())
    }

    /// The KV-cache append ([`super::kv_append`]) on `stream`, before this plan's launch.
    ///
    /// # Safety
    /// As for [`super::kv_append::launch`].
    pub(crate) unsafe fn launch_append(
        &self,
        ap: &mut crate::abi::AppendParams,
        stream: sys::CUstream,
    ) -> Result<()> {
        let f =
            self.kernel.append.as_ref().ok_or_else(|| {
                Error::invalid("append", "appending new rows needs a KV-cache call")
            })?;
        unsafe { super::kv_append::launch(f, ap, stream) }
    }

    /// Decode mode's second launch: merges each row's split partials into O and the LSE.
    unsafe fn launch_combine(
        &self,
        k: &KernelParams,
        d: DecodeSchedule,
        combine: &CudaFunction,
        stream: sys::CUstream,
    ) -> Result<()> {
        let p = &self.params;
        let mut c = CombineParams {
            o_ptr: k.o_ptr,
            lse_ptr: k.lse_ptr,
            ws_o_ptr: k.ws_o_ptr,
            ws_ml_ptr: k.ws_ml_ptr,
            o_stride_b: k.o_stride_b,
            o_stride_s: k.o_stride_s,
            o_stride_h: k.o_stride_h,
            batch: p.batch as i32,
            heads_q: p.heads_q as i32,
            seqlen_q: p.seqlen_q as i32,
            num_splits: d.num_splits as i32,
            scale_log2: k.scale_log2,
            scale: k.scale,
            groups: decode::combine_groups(d.num_splits, p.head_dim) as i32,
            sinks_ptr: k.sinks_ptr,
        };
        let grid =
            decode::combine_ctas(DecodeSchedule::rows(p), p.head_dim, c.groups as usize) as u32;
        let mut args: [*mut std::ffi::c_void; 1] =
            [(&mut c) as *mut CombineParams as *mut std::ffi::c_void];
        // Programmatic dependent launch: the combine grid is launched while the main kernel is
        // still running (its CTAs signal `griddepcontrol.launch_dependents` at the start) and
        // waits in `griddepcontrol.wait` until that grid has finished and its writes are
        // visible, so the launch latency hides under the main kernel's tail. Captured into CUDA
        // graphs as a programmatic edge.
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: COMBINE_THREADS,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        sys::cuLaunchKernelEx(
            &config,
            combine.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::DType;

    #[test]
    fn map_cache_encodes_each_operand_and_buffer_once_and_stays_bounded() {
        let mut cache = MapCache::<u64>::new();
        let encoded = std::cell::Cell::new(0);
        let st = |seq| Strides {
            batch: 4096,
            seq,
            head: 128,
        };
        let get = |cache: &mut MapCache<u64>, op, ptr, s: Strides| {
            cache
                .get_or_encode(op, ptr, s, || {
                    encoded.set(encoded.get() + 1);
                    Ok(ptr ^ (s.seq as u64) ^ ((op == MapOperand::Q) as u64))
                })
                .unwrap()
        };
        let a = get(&mut cache, MapOperand::Q, 256, st(4096));
        assert_eq!(get(&mut cache, MapOperand::Q, 256, st(4096)), a);
        // Another operand, address or stride is another map.
        get(&mut cache, MapOperand::Kv, 256, st(4096));
        get(&mut cache, MapOperand::Q, 512, st(4096));
        get(&mut cache, MapOperand::Q, 256, st(1024));
        assert_eq!(encoded.get(), 4);
        // Two buffers in turn (a decode loop's q): no encoding after the first of each.
        for i in 0..10 {
            get(&mut cache, MapOperand::Q, 256 + 256 * (i % 2), st(4096));
        }
        assert_eq!(encoded.get(), 4);
        // An encoding error is returned and nothing is kept.
        let err = cache.get_or_encode(MapOperand::Kv, 4096, st(8), || {
            Err(Error::Other("no".into()))
        });
        assert!(err.is_err() && !cache.maps.contains_key(&(MapOperand::Kv, 4096, st(8))));
        for ptr in 0..(2 * MAX_MAPS as u64) {
            cache
                .get_or_encode(MapOperand::Kv, ptr << 4, st(8), || Ok(ptr))
                .unwrap();
            assert!(cache.maps.len() <= MAX_MAPS);
        }
    }

    #[test]
    fn programmatic_launch_only_for_shipped_prefill_builds() {
        let prefill = KernelBuild::from(Variant::basic(DType::Bf16, 64, true, 64));
        assert!(pdl_eligible(prefill));
        let timer = TestBuild {
            cycle_timer: true,
            ..TestBuild::default()
        };
        assert!(!pdl_eligible(timer.apply(prefill.variant)));
        let floor = TestBuild {
            floor_control: true,
            ..TestBuild::default()
        };
        assert!(!pdl_eligible(floor.apply(prefill.variant)));
        let decode = KernelBuild::from(Variant {
            decode: true,
            ..prefill.variant
        });
        assert!(!pdl_eligible(decode));
        // The shipped rule: grids that leave SMs idle only; the knob's two fixed settings.
        assert!(pdl_rule(PdlMode::SmallGrids, prefill, 64, 132));
        assert!(!pdl_rule(PdlMode::SmallGrids, prefill, 132, 132));
        assert!(pdl_rule(PdlMode::Always, prefill, 132, 132));
        assert!(!pdl_rule(PdlMode::Never, prefill, 64, 132));
        assert!(!pdl_rule(PdlMode::Always, decode, 64, 132));
    }
}
