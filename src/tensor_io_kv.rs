//! The KV-cache form of `flashcore attn`'s input file: `q`, `k_cache`, `v_cache` (bshd, F16 or
//! BF16), `cache_seqlens` (I32 `[B]`) and optionally this step's `k`, `v` (`[B, n, Hkv, D]`),
//! which are appended at each sequence's length before the attention (flash-attn's
//! `flash_attn_with_kvcache`). With a `block_table` (I32 `[B, max_pages]`) the caches are page
//! pools `[num_pages, page_size, Hkv, D]` and the capacity is `max_pages · page_size`.
//!
//! All metadata is checked here, before anything runs, by the library's own rules: each length
//! within the capacity, and every block-table slot a sequence's keys use inside the pool. Slots
//! past a sequence's last key are never read, so (as in flash-attn) they may hold anything.

use crate::attention::{validate, AttentionParams, Layout, Pages};
use crate::error::{Error, Result};
use crate::tensor_io::{self, Tensor, TensorData};
use std::collections::BTreeMap;
use std::path::Path;

/// One decode step over a KV cache, as read from a file.
pub struct KvInput {
    /// Shape: Sk is the caches' capacity, Sq the new query positions.
    pub params: AttentionParams,
    pub q: TensorData,
    pub k_cache: TensorData,
    pub v_cache: TensorData,
    /// Rows to append per sequence (`[B, n, Hkv, D]`), if the file has them.
    pub new_kv: Option<(TensorData, TensorData, usize)>,
    /// Each sequence's cached rows before the append.
    pub cache_seqlens: Vec<usize>,
    /// A paged cache: the block table (`[B, max_pages]`, row-major) and the pools' geometry.
    pub block_table: Option<(Vec<i32>, Pages)>,
}

impl KvInput {
    /// Element offset of sequence b's cache row r in `k_cache` / `v_cache`.
    pub fn row_offset(&self, b: usize, r: usize) -> usize {
        let p = &self.params;
        let row = p.heads_kv * p.head_dim;
        match &self.block_table {
            Some((table, pg)) => pg.pool_row(table, p.seqlen_k, b, r) * row,
            None => (b * p.seqlen_k + r) * row,
        }
    }
}

fn bad(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::TensorFile(format!("{}: {msg}", path.display()))
}

/// Whether the file holds a KV cache (a tensor named `k_cache`).
pub fn has_kv_cache(path: &Path) -> Result<bool> {
    Ok(tensor_io::tensor_names(path)?
        .iter()
        .any(|n| n == "k_cache"))
}

/// Reads and checks the KV-cache form (bshd only). Shape rules of the kernels are left to
/// [`check_params`](crate::attention::validate::check_params).
pub fn read_kv_input(path: &Path) -> Result<KvInput> {
    let paged = tensor_io::tensor_names(path)?
        .iter()
        .any(|n| n == "block_table");
    let lens = tensor_io::read_i32(path, "cache_seqlens")?;
    let table = if paged {
        Some(tensor_io::read_i32(path, "block_table")?)
    } else {
        None
    };
    let mut t: BTreeMap<String, Tensor> =
        tensor_io::read_file_except(path, &["cache_seqlens", "block_table"])?;
    let mut take = |n: &str| {
        t.remove(n)
            .ok_or_else(|| bad(path, format!("a KV-cache input needs a tensor `{n}`")))
    };
    let (q, kc, vc) = (take("q")?, take("k_cache")?, take("v_cache")?);
    let new = match (t.remove("k"), t.remove("v")) {
        (Some(k), Some(v)) => Some((k, v)),
        (None, None) => None,
        _ => return Err(bad(path, "give both `k` and `v` to append, or neither")),
    };
    let dtype = q.data.attention_dtype().ok_or_else(|| {
        bad(
            path,
            format!(
                "`q` has dtype {}; expected F16 or BF16",
                q.data.dtype_name()
            ),
        )
    })?;
    let mut all = vec![("k_cache", &kc), ("v_cache", &vc)];
    if let Some((k, v)) = &new {
        all.push(("k", k));
        all.push(("v", v));
    }
    for (name, x) in std::iter::once(("q", &q)).chain(all.iter().copied()) {
        if x.shape.len() != 4 {
            return Err(bad(
                path,
                format!(
                    "`{name}` has shape {:?}; expected [B, S, H, D] (bshd)",
                    x.shape
                ),
            ));
        }
        if x.data.attention_dtype() != Some(dtype) {
            return Err(bad(
                path,
                format!(
                    "`{name}` has dtype {}; every tensor must be {}",
                    x.data.dtype_name(),
                    q.data.dtype_name()
                ),
            ));
        }
    }
    if kc.shape != vc.shape {
        return Err(bad(
            path,
            format!(
                "`k_cache` {:?} and `v_cache` {:?} differ",
                kc.shape, vc.shape
            ),
        ));
    }
    let (b, sq, hq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (bc, rows, hkv, dc) = (kc.shape[0], kc.shape[1], kc.shape[2], kc.shape[3]);
    // Paged: k_cache is the pool, and the table's row length sets the capacity.
    let (cap, block_table) = match table {
        Some(t) => {
            if t.shape.len() != 2 || t.shape[0] != b {
                return Err(bad(
                    path,
                    format!(
                        "`block_table` has shape {:?}; expected [{b}, max_pages]",
                        t.shape
                    ),
                ));
            }
            let pages = Pages {
                page_size: rows,
                num_pages: bc,
            };
            if rows < crate::spec::MIN_PAGE_SIZE {
                return Err(bad(
                    path,
                    format!(
                        "page_size: `k_cache` {:?} with a block table is a pool of pages of {rows} rows; a page holds at least {} row",
                        kc.shape,
                        crate::spec::MIN_PAGE_SIZE
                    ),
                ));
            }
            let cap = t.shape[1].checked_mul(rows).ok_or_else(|| {
                bad(
                    path,
                    format!(
                        "`block_table` {:?} with pages of {rows} rows: the capacity overflows",
                        t.shape
                    ),
                )
            })?;
            (cap, Some((t.values, pages)))
        }
        None => (rows, None),
    };
    if (block_table.is_none() && bc != b) || dc != d {
        return Err(bad(
            path,
            format!(
                "`q` {:?} and `k_cache` {:?} disagree on batch or head dim",
                q.shape, kc.shape
            ),
        ));
    }
    if lens.shape != [b] {
        return Err(bad(
            path,
            format!("`cache_seqlens` has shape {:?}; expected [{b}]", lens.shape),
        ));
    }
    let n = match &new {
        Some((k, v)) => {
            if k.shape != v.shape || k.shape[0] != b || k.shape[2] != hkv || k.shape[3] != d {
                return Err(bad(
                    path,
                    format!(
                        "`k` {:?} / `v` {:?} must be [{b}, n, {hkv}, {d}]",
                        k.shape, v.shape
                    ),
                ));
            }
            k.shape[1]
        }
        None => 0,
    };
    let Some(room) = cap.checked_sub(n) else {
        return Err(bad(
            path,
            format!("`k` and `v` append {n} rows, more than the cache's capacity {cap}"),
        ));
    };
    let mut cache_seqlens = Vec::with_capacity(b);
    for (i, &l) in lens.values.iter().enumerate() {
        if l < 0 || l as usize > room {
            return Err(bad(
                path,
                format!("cache_seqlens[{i}] = {l}: with {n} new rows it must lie in [0, {room}]"),
            ));
        }
        cache_seqlens.push(l as usize);
    }
    let params = AttentionParams {
        batch: b,
        seqlen_q: sq,
        seqlen_k: cap,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        dtype,
        layout: Layout::Bshd,
        causal: false,
        scale: None,
        window: Default::default(),
        softcap: 0.0,
    };
    if let Some((t, pg)) = &block_table {
        validate::check_pages(&params, pg).map_err(|e| bad(path, e))?;
        let counts: Vec<i32> = cache_seqlens.iter().map(|&l| (l + n) as i32).collect();
        validate::check_kv_metadata(&params, &counts, Some((t, pg)), false)
            .map_err(|e| bad(path, e))?;
    }
    Ok(KvInput {
        params,
        q: q.data,
        k_cache: kc.data,
        v_cache: vc.data,
        new_kv: new.map(|(k, v)| (k.data, v.data, n)),
        cache_seqlens,
        block_table,
    })
}
