//! safetensors I/O for `flashcore attn`: reads `q`, `k`, `v` and infers the call's shape from
//! them; writes `out` (and `lse`). Every problem with a file is an [`Error::TensorFile`] naming
//! the file, the tensor and what is wrong with it; nothing here panics on a bad file.

use crate::error::{Error, Result};
use crate::spec::{AttentionParams, DType, Layout};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Elements of one tensor, in one of the dtypes flashcore reads or writes.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
}

impl TensorData {
    /// Elements that are NaN or ±Inf (outside flashcore's numerical contract; README "Numerics").
    pub fn count_non_finite(&self) -> usize {
        match self {
            TensorData::F16(v) => v.iter().filter(|x| !x.is_finite()).count(),
            TensorData::Bf16(v) => v.iter().filter(|x| !x.is_finite()).count(),
            TensorData::F32(v) => v.iter().filter(|x| !x.is_finite()).count(),
        }
    }

    /// Copies `len` elements of `src` (same dtype) from `src_at` to `self` at `at`; a dtype
    /// mismatch copies nothing (callers check dtypes first).
    pub fn copy_range(&mut self, at: usize, src: &TensorData, src_at: usize, len: usize) {
        match (self, src) {
            (TensorData::F16(d), TensorData::F16(s)) => {
                d[at..at + len].copy_from_slice(&s[src_at..src_at + len])
            }
            (TensorData::Bf16(d), TensorData::Bf16(s)) => {
                d[at..at + len].copy_from_slice(&s[src_at..src_at + len])
            }
            (TensorData::F32(d), TensorData::F32(s)) => {
                d[at..at + len].copy_from_slice(&s[src_at..src_at + len])
            }
            _ => {}
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TensorData::F16(x) => x.len(),
            TensorData::Bf16(x) => x.len(),
            TensorData::F32(x) => x.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The safetensors name of the dtype: `F16`, `BF16` or `F32`.
    pub fn dtype_name(&self) -> &'static str {
        match self {
            TensorData::F16(_) => "F16",
            TensorData::Bf16(_) => "BF16",
            TensorData::F32(_) => "F32",
        }
    }
    /// The attention dtype, for the 16-bit types.
    pub fn attention_dtype(&self) -> Option<DType> {
        match self {
            TensorData::F16(_) => Some(DType::F16),
            TensorData::Bf16(_) => Some(DType::Bf16),
            TensorData::F32(_) => None,
        }
    }
    /// Every element widened (exactly) to f64.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorData::F16(x) => crate::reference::f16_to_f64(x),
            TensorData::Bf16(x) => crate::reference::bf16_to_f64(x),
            TensorData::F32(x) => crate::reference::f32_to_f64(x),
        }
    }
    fn st_dtype(&self) -> Dtype {
        match self {
            TensorData::F16(_) => Dtype::F16,
            TensorData::Bf16(_) => Dtype::BF16,
            TensorData::F32(_) => Dtype::F32,
        }
    }
    fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            TensorData::F16(x) => x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            TensorData::Bf16(x) => x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            TensorData::F32(x) => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// A tensor: its shape and its elements (row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

/// What `flashcore attn` reads: q, k, v of one dtype, and the parameters their shapes imply
/// (`causal: false`, `scale: None`; the caller sets those).
#[derive(Debug, Clone, PartialEq)]
pub struct AttnInput {
    pub params: AttentionParams,
    pub q: TensorData,
    pub k: TensorData,
    pub v: TensorData,
}

fn bad(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::TensorFile(format!("{}: {msg}", path.display()))
}

fn load(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| bad(path, format!("cannot read the file ({e})")))
}

fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| bad(path, format!("not a safetensors file ({e})")))
}

fn decode(path: &Path, st: &SafeTensors, name: &str) -> Result<Tensor> {
    let view = st.tensor(name).map_err(|_| {
        let mut names = st.names();
        names.sort();
        bad(
            path,
            format!(
                "no tensor named `{name}` (the file has: {})",
                names.join(", ")
            ),
        )
    })?;
    let raw = view.data();
    let two = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
    let data = match view.dtype() {
        Dtype::F16 => TensorData::F16(
            raw.chunks_exact(2)
                .map(|c| f16::from_bits(two(c)))
                .collect(),
        ),
        Dtype::BF16 => TensorData::Bf16(
            raw.chunks_exact(2)
                .map(|c| bf16::from_bits(two(c)))
                .collect(),
        ),
        Dtype::F32 => TensorData::F32(
            raw.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        other => {
            return Err(bad(
                path,
                format!("tensor `{name}` has dtype {other:?}; flashcore reads F16, BF16 and F32"),
            ))
        }
    };
    Ok(Tensor {
        shape: view.shape().to_vec(),
        data,
    })
}

/// Reads every tensor of a safetensors file (dtypes F16, BF16, F32).
pub fn read_file(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    read_file_except(path, &[])
}

/// [`read_file`] without the tensors named in `skip` (e.g. integer metadata read otherwise).
pub fn read_file_except(path: &Path, skip: &[&str]) -> Result<BTreeMap<String, Tensor>> {
    let bytes = load(path)?;
    let st = parse(path, &bytes)?;
    st.names()
        .into_iter()
        .filter(|n| !skip.contains(n))
        .map(|n| Ok((n.to_string(), decode(path, &st, n)?)))
        .collect()
}

/// The names of a safetensors file's tensors.
pub fn tensor_names(path: &Path) -> Result<Vec<String>> {
    let bytes = load(path)?;
    let st = parse(path, &bytes)?;
    Ok(st.names().into_iter().map(|n| n.to_string()).collect())
}

/// The optional `sinks` tensor of an attention input: learnable attention sinks, F32 of one
/// value per query head (shape `[Hq]`). `None` when the file has no `sinks`.
pub fn read_sinks(path: &Path) -> Result<Option<Vec<f32>>> {
    let bytes = load(path)?;
    let st = parse(path, &bytes)?;
    let Ok(view) = st.tensor("sinks") else {
        return Ok(None);
    };
    if view.dtype() != Dtype::F32 || view.shape().len() != 1 {
        return Err(bad(
            path,
            format!(
                "tensor `sinks` is {:?} {:?}; expected F32 [Hq] (one logit per query head)",
                view.dtype(),
                view.shape()
            ),
        ));
    }
    Ok(Some(
        view.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    ))
}

/// An integer tensor (metadata such as `cache_seqlens`).
pub struct I32Tensor {
    pub shape: Vec<usize>,
    pub values: Vec<i32>,
}

/// Reads tensor `name`, which must be I32.
pub fn read_i32(path: &Path, name: &str) -> Result<I32Tensor> {
    let bytes = load(path)?;
    let st = parse(path, &bytes)?;
    let view = st
        .tensor(name)
        .map_err(|_| bad(path, format!("no tensor named `{name}`")))?;
    if view.dtype() != Dtype::I32 {
        return Err(bad(
            path,
            format!("tensor `{name}` has dtype {:?}; expected I32", view.dtype()),
        ));
    }
    Ok(I32Tensor {
        shape: view.shape().to_vec(),
        values: view
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

/// (B, S, H, D) of a 4-D tensor in `layout`.
fn dims(shape: &[usize], layout: Layout) -> (usize, usize, usize, usize) {
    match layout {
        Layout::Bshd => (shape[0], shape[1], shape[2], shape[3]),
        Layout::Bhsd => (shape[0], shape[2], shape[1], shape[3]),
    }
}

/// Reads tensors `q`, `k`, `v` (F16 or BF16, all one dtype, 4-D in `layout`:
/// bshd `[B, S, H, D]`, bhsd `[B, H, S, D]`) and infers B, Sq, Hq, D from `q`, Sk and Hkv from
/// `k`. `k` and `v` must have the same shape, and B and D must agree between `q` and `k`.
/// Shape rules of the kernels (head dim, GQA ratio, non-zero dims) are left to
/// [`check_params`](crate::attention::validate::check_params).
pub fn read_attn_input(path: &Path, layout: Layout) -> Result<AttnInput> {
    let bytes = load(path)?;
    let st = parse(path, &bytes)?;
    let [q, k, v] = ["q", "k", "v"].map(|n| decode(path, &st, n));
    let (q, k, v) = (q?, k?, v?);
    let dtype = q.data.attention_dtype().ok_or_else(|| {
        bad(
            path,
            format!(
                "tensor `q` has dtype {}; q, k and v must be F16 or BF16",
                q.data.dtype_name()
            ),
        )
    })?;
    for (name, t) in [("k", &k), ("v", &v)] {
        if t.data.attention_dtype() != Some(dtype) {
            return Err(bad(
                path,
                format!(
                    "tensor `{name}` has dtype {} but `q` has {}; q, k and v must share one dtype (F16 or BF16)",
                    t.data.dtype_name(),
                    q.data.dtype_name()
                ),
            ));
        }
    }
    let axes = match layout {
        Layout::Bshd => "[B, S, H, D]",
        Layout::Bhsd => "[B, H, S, D]",
    };
    for (name, t) in [("q", &q), ("k", &k), ("v", &v)] {
        if t.shape.len() != 4 {
            return Err(bad(
                path,
                format!(
                    "tensor `{name}` has shape {:?} (rank {}); expected rank 4, {axes} for layout {}",
                    t.shape,
                    t.shape.len(),
                    layout.name()
                ),
            ));
        }
    }
    if k.shape != v.shape {
        return Err(bad(
            path,
            format!(
                "`k` has shape {:?} but `v` has shape {:?}; they must be equal",
                k.shape, v.shape
            ),
        ));
    }
    let (b, sq, hq, d) = dims(&q.shape, layout);
    let (bk, sk, hkv, dk) = dims(&k.shape, layout);
    if b != bk {
        return Err(bad(
            path,
            format!(
                "batch differs: `q` {:?} has {b}, `k` {:?} has {bk} (layout {} is {axes})",
                q.shape,
                k.shape,
                layout.name()
            ),
        ));
    }
    if d != dk {
        return Err(bad(
            path,
            format!(
                "head dim differs: `q` {:?} has {d}, `k` {:?} has {dk}",
                q.shape, k.shape
            ),
        ));
    }
    let params = AttentionParams {
        batch: b,
        seqlen_q: sq,
        seqlen_k: sk,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        dtype,
        layout,
        causal: false,
        scale: None,
        window: Default::default(),
        softcap: 0.0,
    };
    Ok(AttnInput {
        params,
        q: q.data,
        k: k.data,
        v: v.data,
    })
}

/// Writes `tensors` (name, tensor) to a safetensors file, with optional string metadata.
/// A shape that does not match the element count is an [`Error::TensorFile`]; a failed write
/// is an [`Error::Io`].
pub fn write_file(
    path: &Path,
    tensors: &[(&str, &Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let encoded: Vec<(&str, &Tensor, Vec<u8>)> = tensors
        .iter()
        .map(|&(n, t)| (n, t, t.data.to_le_bytes()))
        .collect();
    let views = encoded
        .iter()
        .map(|(n, t, bytes)| {
            safetensors::tensor::TensorView::new(t.data.st_dtype(), t.shape.clone(), bytes)
                .map(|view| (*n, view))
                .map_err(|e| {
                    bad(
                        path,
                        format!(
                            "tensor `{n}`: shape {:?} does not fit its {} elements ({e})",
                            t.shape,
                            t.data.len()
                        ),
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, metadata)
        .map_err(|e| bad(path, format!("cannot serialize ({e})")))?;
    crate::output::write_atomic(path, &bytes)
}

/// Writes the result of one call: `out` in the shape of `q` (layout `p.layout`) and, when
/// given, `lse` as f32 `[B, Hq, Sq]`. The metadata records layout, causal flag and scale.
pub fn write_attn_output(
    path: &Path,
    p: &AttentionParams,
    out: TensorData,
    lse: Option<Vec<f32>>,
) -> Result<()> {
    let out = Tensor {
        shape: p
            .layout
            .shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim)
            .to_vec(),
        data: out,
    };
    write_attn_tensors(path, p, &[("out", &out)], lse)
}

/// Writes `tensors` and, when given, `lse` (f32 `[B, Hq, Sq]`, last) with the attention
/// metadata: the one writer of every `flashcore attn` output file, so `lse` is shaped alike.
pub fn write_attn_tensors(
    path: &Path,
    p: &AttentionParams,
    tensors: &[(&str, &Tensor)],
    lse: Option<Vec<f32>>,
) -> Result<()> {
    let lse = lse.map(|l| Tensor {
        shape: vec![p.batch, p.heads_q, p.seqlen_q],
        data: TensorData::F32(l),
    });
    let mut tensors = tensors.to_vec();
    if let Some(l) = &lse {
        tensors.push(("lse", l));
    }
    write_file(path, &tensors, Some(attn_metadata(p)))
}

/// The metadata of an attention output file: layout, causal flag and scale.
pub fn attn_metadata(p: &AttentionParams) -> HashMap<String, String> {
    HashMap::from([
        ("layout".to_string(), p.layout.name().to_string()),
        ("causal".to_string(), p.causal.to_string()),
        ("scale".to_string(), p.softmax_scale().to_string()),
    ])
}
