//! Argument checks, on the host and without a GPU: candle's dtypes, ranks and shapes, which
//! layouts TMA reads in place, then flashcore's own rules (head dims, GQA, alignment, strides)
//! through `flashcore::attention::external::validate*` on the call the op would make.

use candle_core::{DType as CDType, Layout, Tensor};
use flashcore::attention::decode::{self, Pages};
use flashcore::attention::external::{self, DeviceTensor, ExternalCall, Strides, VarlenCall};
use flashcore::attention::kv_append::KvAppend;
use flashcore::attention::launch::Lengths;
use flashcore::attention::{AttentionParams, DType, Layout as FcLayout, Window};
use std::sync::atomic::AtomicBool;

pub(crate) static POISON: AtomicBool = AtomicBool::new(false);

/// Stand-in device addresses for checking a call on the host: 16-byte aligned, far apart.
const FAKE_BASE: [u64; 8] = [
    1 << 40,
    2 << 40,
    3 << 40,
    4 << 40,
    5 << 40,
    6 << 40,
    7 << 40,
    8 << 40,
];

pub(crate) fn err(msg: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("flashcore-candle: {msg}"))
}

pub(crate) fn from_flashcore(e: flashcore::Error) -> candle_core::Error {
    err(e)
}

pub(crate) fn unsupported_alibi() -> candle_core::Error {
    err("alibi_slopes: ALiBi is not supported by flashcore")
}

/// Without the `cuda` feature no tensor passes [`on_cuda`], so the calls never get this far;
/// the error keeps their signatures whole.
#[cfg_attr(feature = "cuda", allow(dead_code))]
pub(crate) fn no_cuda_feature() -> candle_core::Error {
    err("built without the `cuda` feature: candle has no CUDA tensors to run on")
}

fn dtype(name: &str, t: &Tensor) -> candle_core::Result<DType> {
    match t.dtype() {
        CDType::F16 => Ok(DType::F16),
        CDType::BF16 => Ok(DType::Bf16),
        dt => Err(err(format!(
            "{name}: dtype {dt:?} is not supported (f16 or bf16)"
        ))),
    }
}

fn same_dtype(pairs: &[(&str, &Tensor)]) -> candle_core::Result<DType> {
    let (n0, t0) = pairs[0];
    let d = dtype(n0, t0)?;
    for &(n, t) in &pairs[1..] {
        if t.dtype() != t0.dtype() {
            return Err(err(format!(
                "{n}: dtype {:?} differs from {n0}'s {:?}",
                t.dtype(),
                t0.dtype()
            )));
        }
    }
    Ok(d)
}

fn dims<const N: usize>(name: &str, t: &Tensor, what: &str) -> candle_core::Result<[usize; N]> {
    t.dims().try_into().map_err(|_| {
        err(format!(
            "{name}: expected rank {N} ({what}), got shape {:?}",
            t.dims()
        ))
    })
}

fn index_dtype(name: &str, t: &Tensor) -> candle_core::Result<()> {
    match t.dtype() {
        CDType::U32 | CDType::I32 => Ok(()),
        dt => Err(err(format!("{name}: dtype {dt:?}, expected u32 or i32"))),
    }
}

/// Whether TMA cannot read `layout` in place (2-byte elements): the head dim is not contiguous,
/// the start is not 16-byte aligned (allocations are), or a dim of extent > 1 has a stride that
/// is zero (a broadcast) or not a multiple of 16 bytes. Such inputs are copied once.
pub fn needs_copy(layout: &Layout) -> bool {
    let dims = layout.dims();
    let strides = layout.stride();
    let Some((&last, outer)) = strides.split_last() else {
        return true;
    };
    if last != 1 && dims[dims.len() - 1] > 1 {
        return true;
    }
    if (layout.start_offset() * 2) % 16 != 0 {
        return true;
    }
    outer
        .iter()
        .zip(dims)
        .any(|(&s, &d)| d > 1 && (s == 0 || (s * 2) % 16 != 0))
}

/// `t` itself when TMA can read it in place, else a contiguous copy.
pub(crate) fn tma_ready(t: &Tensor) -> candle_core::Result<Tensor> {
    if needs_copy(t.layout()) {
        t.force_contiguous()
    } else {
        Ok(t.clone())
    }
}

/// A `[b, s, h, d]` (rank 4) or `[s, h, d]` (rank 3, packed) layout as a flashcore tensor at
/// `base` (the storage's address): element strides of (batch, seq, head).
pub(crate) fn device_tensor(layout: &Layout, base: u64, esize: usize) -> DeviceTensor {
    let st = layout.stride();
    let strides = match *st {
        [b, s, h, _] => [b, s, h],
        [s, h, _] => [0, s, h],
        _ => [0, 0, 0],
    };
    DeviceTensor {
        ptr: base + (layout.start_offset() * esize) as u64,
        strides: Strides {
            batch: strides[0] as i64,
            seq: strides[1] as i64,
            head: strides[2] as i64,
        },
    }
}

/// Every tensor on one CUDA device.
pub(crate) fn on_cuda(all: &[(&str, &Tensor)]) -> candle_core::Result<()> {
    let (n0, t0) = all[0];
    for &(n, t) in all {
        if !t.device().is_cuda() {
            let build = if cfg!(feature = "cuda") {
                ""
            } else {
                " (and this build has no `cuda` feature, so candle has none)"
            };
            return Err(err(format!(
                "{n} is on {:?}: flashcore runs on CUDA tensors of an sm_90 GPU (H100/H200){build}",
                t.device().location()
            )));
        }
        if !t.device().same_device(t0.device()) {
            return Err(err(format!(
                "{n} is on {:?}, {n0} on {:?}: all tensors must be on one device",
                t.device().location(),
                t0.device().location()
            )));
        }
    }
    Ok(())
}

fn params(
    [b, sq, sk, hq, hkv, d]: [usize; 6],
    dtype: DType,
    scale: f32,
    causal: bool,
) -> AttentionParams {
    AttentionParams {
        batch: b,
        seqlen_q: sq,
        seqlen_k: sk,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        dtype,
        layout: FcLayout::Bshd,
        causal,
        scale: Some(scale),
        window: Window::UNBOUNDED,
        softcap: 0.0,
    }
}

fn kv_shapes(
    names: [&str; 3],
    q_head_dim: usize,
    k: &Tensor,
    v: &Tensor,
) -> candle_core::Result<()> {
    if k.dims() != v.dims() {
        return Err(err(format!(
            "{}: shape {:?} differs from {}'s {:?}",
            names[2],
            v.dims(),
            names[1],
            k.dims()
        )));
    }
    let d = *k.dims().last().unwrap_or(&0);
    if d != q_head_dim {
        return Err(err(format!(
            "{}: head_dim {d} differs from {}'s {q_head_dim}",
            names[1], names[0]
        )));
    }
    Ok(())
}

/// A dense call: flash_attn, flash_attn_windowed, flash_attn_alibi_windowed_softcap.
#[derive(Debug, Clone)]
pub struct DenseSpec {
    pub params: AttentionParams,
}

impl DenseSpec {
    /// Shape and dtype rules of `q` `[b, sq, hq, d]`, `k`/`v` `[b, sk, hkv, d]`.
    pub fn new(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scale: f32,
        left: Option<usize>,
        right: Option<usize>,
        softcap: f32,
    ) -> candle_core::Result<DenseSpec> {
        let dt = same_dtype(&[("q", q), ("k", k), ("v", v)])?;
        let [b, sq, hq, d] = dims("q", q, "batch, seqlen_q, heads_q, head_dim")?;
        let [bk, sk, hkv, _] = dims("k", k, "batch, seqlen_k, heads_kv, head_dim")?;
        dims::<4>("v", v, "batch, seqlen_k, heads_kv, head_dim")?;
        kv_shapes(["q", "k", "v"], d, k, v)?;
        if bk != b {
            return Err(err(format!("k: batch {bk} differs from q's {b}")));
        }
        // flash-attn's rule: a right window of 0 is the causal mask (flashcore's causal path).
        let causal = right == Some(0);
        let mut p = params([b, sq, sk, hq, hkv, d], dt, scale, causal);
        p.window = Window {
            left,
            right: if causal { None } else { right },
        };
        p.softcap = softcap;
        Ok(DenseSpec { params: p })
    }

    /// Device scratch of the decode kernels' key splits (calls of at most 16 query positions).
    pub fn workspace_bytes(&self) -> usize {
        decode::workspace_bytes(&self.params, Lengths::None)
    }

    /// The call on q, k, v at these layouts and addresses, `out` contiguous at `base[3]`, the
    /// workspace at `base[4]`.
    pub(crate) fn call(&self, l: [&Layout; 3], base: [u64; 5]) -> ExternalCall {
        let p = &self.params;
        let es = p.dtype.size();
        let out = DeviceTensor {
            ptr: base[3],
            strides: Strides::contiguous(FcLayout::Bshd, p.seqlen_q, p.heads_q, p.head_dim),
        };
        ExternalCall::new(
            p.clone(),
            device_tensor(l[0], base[0], es),
            device_tensor(l[1], base[1], es),
            device_tensor(l[2], base[2], es),
            out,
        )
        .workspace(base[4])
    }

    /// flashcore's rules on the call the op would make (no GPU).
    pub fn validate(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<()> {
        let ws = if self.workspace_bytes() > 0 {
            FAKE_BASE[4]
        } else {
            0
        };
        let c = self.call(
            [q.layout(), k.layout(), v.layout()],
            [FAKE_BASE[0], FAKE_BASE[1], FAKE_BASE[2], FAKE_BASE[3], ws],
        );
        external::validate(&c).map_err(from_flashcore)
    }
}

/// A varlen call.
#[derive(Debug, Clone)]
pub struct VarlenSpec {
    pub params: AttentionParams,
    pub total_q: usize,
    pub total_k: usize,
}

impl VarlenSpec {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        seqlens_q: &Tensor,
        seqlens_k: &Tensor,
        max_seqlen_q: usize,
        max_seqlen_k: usize,
        scale: f32,
        causal: bool,
    ) -> candle_core::Result<VarlenSpec> {
        let dt = same_dtype(&[("q", q), ("k", k), ("v", v)])?;
        let [total_q, hq, d] = dims("q", q, "total_q, heads_q, head_dim")?;
        let [total_k, hkv, _] = dims("k", k, "total_k, heads_kv, head_dim")?;
        dims::<3>("v", v, "total_k, heads_kv, head_dim")?;
        kv_shapes(["q", "k", "v"], d, k, v)?;
        let [nq] = dims("seqlens_q", seqlens_q, "batch + 1")?;
        let [nk] = dims("seqlens_k", seqlens_k, "batch + 1")?;
        index_dtype("seqlens_q", seqlens_q)?;
        index_dtype("seqlens_k", seqlens_k)?;
        if nq != nk {
            return Err(err(format!(
                "seqlens_k: {nk} entries, seqlens_q has {nq}: both are batch + 1"
            )));
        }
        if nq < 2 {
            return Err(err(format!(
                "seqlens_q: {nq} entries; cumulative lengths of at least one sequence need 2"
            )));
        }
        Ok(VarlenSpec {
            params: params(
                [nq - 1, max_seqlen_q, max_seqlen_k, hq, hkv, d],
                dt,
                scale,
                causal,
            ),
            total_q,
            total_k,
        })
    }

    /// Device scratch the call needs (its work list).
    pub fn workspace_bytes(&self) -> usize {
        external::varlen::workspace_bytes(&self.params)
    }

    /// `meta`: cu_seqlens_q, cu_seqlens_k; `base`: q, k, v, out, workspace.
    pub(crate) fn call(&self, l: [&Layout; 3], base: [u64; 5], meta: [u64; 2]) -> VarlenCall {
        let p = &self.params;
        let es = p.dtype.size();
        let out = DeviceTensor {
            ptr: base[3],
            strides: Strides {
                batch: 0,
                seq: (p.heads_q * p.head_dim) as i64,
                head: p.head_dim as i64,
            },
        };
        VarlenCall {
            params: p.clone(),
            total_q: self.total_q,
            total_k: self.total_k,
            q: device_tensor(l[0], base[0], es),
            k: device_tensor(l[1], base[1], es),
            v: device_tensor(l[2], base[2], es),
            out,
            lse: 0,
            cu_seqlens_q: meta[0],
            cu_seqlens_k: meta[1],
            seqused_k: 0,
            seqused_q: 0,
            workspace: base[4],
            sinks: 0,
            pages: None,
        }
    }

    pub fn validate(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<()> {
        let ws = if self.workspace_bytes() > 0 {
            FAKE_BASE[4]
        } else {
            0
        };
        let c = self.call(
            [q.layout(), k.layout(), v.layout()],
            [FAKE_BASE[0], FAKE_BASE[1], FAKE_BASE[2], FAKE_BASE[3], ws],
            [FAKE_BASE[5], FAKE_BASE[6]],
        );
        external::validate_varlen(&c).map_err(from_flashcore)
    }
}

/// A KV-cache call.
#[derive(Debug, Clone)]
pub struct KvCacheSpec {
    pub params: AttentionParams,
    pub pages: Option<Pages>,
    /// New K/V rows per sequence to append first (0: none).
    pub rows: usize,
}

impl KvCacheSpec {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        new: (Option<&Tensor>, Option<&Tensor>),
        cache_seqlens: &Tensor,
        block_table: Option<&Tensor>,
        scale: f32,
        causal: bool,
    ) -> candle_core::Result<KvCacheSpec> {
        let mut all = vec![("q", q), ("k_cache", k_cache), ("v_cache", v_cache)];
        let rows = match new {
            (Some(k), Some(v)) => {
                all.extend([("k", k), ("v", v)]);
                Some((k, v))
            }
            (None, None) => None,
            _ => {
                return Err(err(
                    "k, v: new keys and values are given together or not at all",
                ))
            }
        };
        let dt = same_dtype(&all)?;
        let [b, sq, hq, d] = dims("q", q, "batch, seqlen_q, heads_q, head_dim")?;
        let what = if block_table.is_some() {
            "num_pages, page_size, heads_kv, head_dim"
        } else {
            "batch, capacity, heads_kv, head_dim"
        };
        let [c0, c1, hkv, _] = dims("k_cache", k_cache, what)?;
        dims::<4>("v_cache", v_cache, what)?;
        kv_shapes(["q", "k_cache", "v_cache"], d, k_cache, v_cache)?;
        let [nb] = dims("cache_seqlens", cache_seqlens, "batch")?;
        index_dtype("cache_seqlens", cache_seqlens)?;
        if nb != b {
            return Err(err(format!(
                "cache_seqlens: {nb} entries for a batch of {b}"
            )));
        }
        let (capacity, pages) = match block_table {
            Some(t) => {
                let [tb, per_seq] = dims("block_table", t, "batch, pages_per_seq")?;
                index_dtype("block_table", t)?;
                if tb != b {
                    return Err(err(format!("block_table: {tb} rows for a batch of {b}")));
                }
                if c1 < decode::MIN_PAGE_SIZE {
                    return Err(err(format!(
                        "k_cache: a pool of pages of {c1} rows; a page_size of at least {} row",
                        decode::MIN_PAGE_SIZE
                    )));
                }
                let pg = Pages {
                    page_size: c1,
                    num_pages: c0,
                };
                (per_seq * c1, Some(pg))
            }
            None => {
                if c0 != b {
                    return Err(err(format!("k_cache: batch {c0} differs from q's {b}")));
                }
                (c1, None)
            }
        };
        // The caches are read and written where they are: a copy would lose the append.
        for (n, t) in [("k_cache", k_cache), ("v_cache", v_cache)] {
            if needs_copy(t.layout()) {
                return Err(err(format!(
                    "{n}: layout (strides {:?}, offset {}) is not one TMA can address in place (contiguous head dim, 16-byte aligned start and strides): keep the cache contiguous",
                    t.layout().stride(),
                    t.layout().start_offset()
                )));
            }
        }
        let rows = match rows {
            Some((k, v)) => {
                let [kb, n, kh, _] = dims("k", k, "batch, new rows, heads_kv, head_dim")?;
                dims::<4>("v", v, "batch, new rows, heads_kv, head_dim")?;
                kv_shapes(["q", "k", "v"], d, k, v)?;
                if kb != b || kh != hkv {
                    return Err(err(format!(
                        "k: shape {:?}, expected [{b}, new rows, {hkv}, {d}]",
                        k.dims()
                    )));
                }
                n
            }
            None => 0,
        };
        Ok(KvCacheSpec {
            params: params([b, sq, capacity, hq, hkv, d], dt, scale, causal),
            pages,
            rows,
        })
    }

    pub fn lengths(&self) -> Lengths {
        Lengths::kv_cache(false, self.pages)
    }

    /// Device scratch of the decode kernels' key splits.
    pub fn workspace_bytes(&self) -> usize {
        decode::workspace_bytes(&self.params, self.lengths())
    }

    /// `base`: q, k_cache, v_cache, out, workspace; `meta`: cache_seqlens, block table, counts
    /// written by the append; `new`: the new rows' layouts and addresses.
    pub(crate) fn call(
        &self,
        l: [&Layout; 3],
        base: [u64; 5],
        meta: [u64; 3],
        new: Option<[(&Layout, u64); 2]>,
    ) -> ExternalCall {
        let p = &self.params;
        let es = p.dtype.size();
        let out = DeviceTensor {
            ptr: base[3],
            strides: Strides::contiguous(FcLayout::Bshd, p.seqlen_q, p.heads_q, p.head_dim),
        };
        let mut c = ExternalCall::new(
            p.clone(),
            device_tensor(l[0], base[0], es),
            device_tensor(l[1], base[1], es),
            device_tensor(l[2], base[2], es),
            out,
        )
        .kv_lengths(meta[0])
        .workspace(base[4]);
        if let Some(pg) = self.pages {
            c = c.paged(meta[1], pg);
        }
        if let Some([(kl, kp), (vl, vp)]) = new {
            c = c.append(KvAppend {
                k: device_tensor(kl, kp, es),
                v: device_tensor(vl, vp, es),
                rows: self.rows,
                counts: meta[2],
            });
        }
        c
    }

    pub fn validate(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        new: Option<(&Tensor, &Tensor)>,
    ) -> candle_core::Result<()> {
        let ws = if self.workspace_bytes() > 0 {
            FAKE_BASE[4]
        } else {
            0
        };
        let new = new.map(|(k, v)| [(k.layout(), FAKE_BASE[5]), (v.layout(), FAKE_BASE[6])]);
        let c = self.call(
            [q.layout(), k_cache.layout(), v_cache.layout()],
            [FAKE_BASE[0], FAKE_BASE[1], FAKE_BASE[2], FAKE_BASE[3], ws],
            [FAKE_BASE[7], FAKE_BASE[7] + 4096, FAKE_BASE[7] + 8192],
            new,
        );
        external::validate(&c).map_err(from_flashcore)
    }
}
