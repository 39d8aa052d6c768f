//! safetensors round trips and every error path of reading q, k, v, each from a file written
//! here.

use flashcore::attention::{DType, Layout};
use flashcore::tensor_io::{
    read_attn_input, read_file, write_attn_output, write_file, Tensor, TensorData,
};
use flashcore::{AttentionParams, Error};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(11)
}

fn f16s(n: usize) -> TensorData {
    let mut r = rng();
    TensorData::F16(
        (0..n)
            .map(|_| f16::from_f32(r.random_range(-4.0..4.0)))
            .collect(),
    )
}

fn bf16s(n: usize) -> TensorData {
    let mut r = rng();
    TensorData::Bf16(
        (0..n)
            .map(|_| bf16::from_f32(r.random_range(-4.0..4.0)))
            .collect(),
    )
}

fn t(shape: &[usize], data: TensorData) -> Tensor {
    Tensor {
        shape: shape.to_vec(),
        data,
    }
}

fn n(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Writes q, k, v of the given shapes (F16) to `dir/name`.
fn qkv_file(dir: &Path, name: &str, qs: &[usize], ks: &[usize], vs: &[usize]) -> PathBuf {
    let path = dir.join(name);
    let (q, k, v) = (t(qs, f16s(n(qs))), t(ks, f16s(n(ks))), t(vs, f16s(n(vs))));
    write_file(&path, &[("q", &q), ("k", &k), ("v", &v)], None).unwrap();
    path
}

/// The message of an `Error::TensorFile`, failing the test on any other outcome.
fn tensor_file_error<T: std::fmt::Debug>(r: flashcore::Result<T>) -> String {
    match r {
        Err(Error::TensorFile(m)) => m,
        other => panic!("expected Error::TensorFile, got {other:?}"),
    }
}

#[test]
fn round_trip_f16_bf16_f32() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rt.safetensors");
    let a = t(&[2, 3, 4], f16s(24));
    let b = t(&[5, 2], bf16s(10));
    let c = t(&[3], TensorData::F32(vec![1.5, f32::NEG_INFINITY, -0.0]));
    write_file(&path, &[("a", &a), ("b", &b), ("c", &c)], None).unwrap();
    let back = read_file(&path).unwrap();
    assert_eq!(back.len(), 3);
    assert_eq!(back["a"], a);
    assert_eq!(back["b"], b);
    assert_eq!(back["c"], c);
    assert!(matches!(back["c"].data, TensorData::F32(ref x) if x[2].is_sign_negative()));
}

#[test]
fn write_rejects_shape_not_matching_data() {
    let dir = tempfile::tempdir().unwrap();
    let bad = t(&[2, 3], f16s(5));
    let m = tensor_file_error(write_file(&dir.path().join("x"), &[("out", &bad)], None));
    assert!(m.contains("`out`") && m.contains("[2, 3]"), "{m}");
}

#[test]
fn infers_params_in_both_layouts_with_gqa() {
    let dir = tempfile::tempdir().unwrap();
    // B=2, Sq=5, Hq=4, D=64; Sk=7, Hkv=2.
    let p = qkv_file(
        dir.path(),
        "bshd",
        &[2, 5, 4, 64],
        &[2, 7, 2, 64],
        &[2, 7, 2, 64],
    );
    let inp = read_attn_input(&p, Layout::Bshd).unwrap();
    let want = AttentionParams {
        batch: 2,
        seqlen_q: 5,
        seqlen_k: 7,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 64,
        dtype: DType::F16,
        layout: Layout::Bshd,
        causal: false,
        scale: None,
        window: Default::default(),
        softcap: 0.0,
    };
    assert_eq!(inp.params, want);
    assert_eq!(inp.q, f16s(2 * 5 * 4 * 64));
    assert_eq!(inp.k.len(), 2 * 7 * 2 * 64);

    let p = qkv_file(
        dir.path(),
        "bhsd",
        &[2, 4, 5, 64],
        &[2, 2, 7, 64],
        &[2, 2, 7, 64],
    );
    let inp = read_attn_input(&p, Layout::Bhsd).unwrap();
    assert_eq!(
        inp.params,
        AttentionParams {
            layout: Layout::Bhsd,
            ..want
        }
    );
}

#[test]
fn reads_bf16_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bf16");
    let s = [1, 3, 2, 64];
    let (q, k, v) = (
        t(&s, bf16s(n(&s))),
        t(&s, bf16s(n(&s))),
        t(&s, bf16s(n(&s))),
    );
    write_file(&path, &[("q", &q), ("k", &k), ("v", &v)], None).unwrap();
    let inp = read_attn_input(&path, Layout::Bshd).unwrap();
    assert_eq!(inp.params.dtype, DType::Bf16);
    assert_eq!(inp.v, v.data);
}

#[test]
fn attn_output_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(2, 3, 5, 64)
        .layout(Layout::Bhsd)
        .dtype(DType::Bf16)
        .causal(true);
    let out = bf16s(p.q_len());
    let lse: Vec<f32> = (0..p.lse_len()).map(|i| i as f32 - 3.0).collect();
    let path = dir.path().join("out");
    write_attn_output(&path, &p, out.clone(), Some(lse.clone())).unwrap();
    let back = read_file(&path).unwrap();
    assert_eq!(back["out"], t(&[2, 3, 5, 64], out));
    assert_eq!(back["lse"], t(&[2, 3, 5], TensorData::F32(lse)));

    // Without lse only `out` is written.
    write_attn_output(&path, &p, f16s(p.q_len()), None).unwrap();
    assert_eq!(
        read_file(&path).unwrap().keys().collect::<Vec<_>>(),
        ["out"]
    );
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.safetensors");
    let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
    assert!(
        m.contains("nope.safetensors") && m.contains("cannot read"),
        "{m}"
    );
}

#[test]
fn garbage_and_truncated_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng();
    let garbage: Vec<u8> = (0..4096).map(|_| r.random()).collect();
    let empty = Vec::new();
    // A valid 8-byte header length followed by a header that is not JSON.
    let mut bad_json = 16u64.to_le_bytes().to_vec();
    bad_json.extend(b"{not json at all");
    for (i, bytes) in [garbage, empty, bad_json].iter().enumerate() {
        let path = dir.path().join(format!("bad{i}"));
        std::fs::write(&path, bytes).unwrap();
        let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
        assert!(m.contains("not a safetensors file"), "{m}");
        tensor_file_error(read_file(&path));
    }
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no_k");
    let s = [1, 4, 2, 64];
    let (q, v) = (t(&s, f16s(n(&s))), t(&s, f16s(n(&s))));
    write_file(&path, &[("q", &q), ("key", &v), ("v", &v)], None).unwrap();
    let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
    assert!(
        m.contains("no tensor named `k`") && m.contains("key, q, v"),
        "{m}"
    );
}

#[test]
fn wrong_dtype_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let s = [1, 4, 2, 64];
    let f32s = TensorData::F32(vec![0.5; n(&s)]);
    // q in F32.
    let path = dir.path().join("q_f32");
    let (q, k) = (t(&s, f32s.clone()), t(&s, f16s(n(&s))));
    write_file(&path, &[("q", &q), ("k", &k), ("v", &k)], None).unwrap();
    let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
    assert!(m.contains("`q`") && m.contains("F32"), "{m}");
    // v in BF16 while q, k are F16.
    let path = dir.path().join("v_bf16");
    let v = t(&s, bf16s(n(&s)));
    write_file(&path, &[("q", &k), ("k", &k), ("v", &v)], None).unwrap();
    let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
    assert!(
        m.contains("`v`") && m.contains("BF16") && m.contains("F16"),
        "{m}"
    );
    // k in I64 (a dtype flashcore does not read at all), written with the safetensors crate.
    let path = dir.path().join("k_i64");
    let bytes = vec![0u8; n(&s) * 8];
    let qb: Vec<u8> = (0..n(&s))
        .flat_map(|_| f16::ONE.to_bits().to_le_bytes())
        .collect();
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let views = vec![
        ("q", TensorView::new(Dtype::F16, s.to_vec(), &qb).unwrap()),
        (
            "k",
            TensorView::new(Dtype::I64, s.to_vec(), &bytes).unwrap(),
        ),
        ("v", TensorView::new(Dtype::F16, s.to_vec(), &qb).unwrap()),
    ];
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
    assert!(m.contains("`k`") && m.contains("I64"), "{m}");
}

#[test]
fn wrong_rank_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = qkv_file(
        dir.path(),
        "rank3",
        &[1, 4, 64],
        &[1, 4, 1, 64],
        &[1, 4, 1, 64],
    );
    let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
    assert!(
        m.contains("`q`") && m.contains("rank 3") && m.contains("[B, S, H, D]"),
        "{m}"
    );
    let path = qkv_file(
        dir.path(),
        "rank5",
        &[1, 4, 1, 64],
        &[1, 4, 1, 64],
        &[1, 1, 4, 1, 64],
    );
    let m = tensor_file_error(read_attn_input(&path, Layout::Bhsd));
    assert!(
        m.contains("`v`") && m.contains("rank 5") && m.contains("[B, H, S, D]"),
        "{m}"
    );
}

#[test]
fn mismatched_shapes_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    type Case<'a> = (&'a str, [usize; 4], [usize; 4], [usize; 4], &'a str);
    let cases: [Case; 3] = [
        (
            "kv",
            [1, 4, 2, 64],
            [1, 6, 2, 64],
            [1, 5, 2, 64],
            "`v` has shape [1, 5, 2, 64]",
        ),
        (
            "batch",
            [2, 4, 2, 64],
            [1, 6, 2, 64],
            [1, 6, 2, 64],
            "batch differs",
        ),
        (
            "dim",
            [1, 4, 2, 64],
            [1, 6, 2, 128],
            [1, 6, 2, 128],
            "head dim differs",
        ),
    ];
    for (name, qs, ks, vs, want) in cases {
        let path = qkv_file(dir.path(), name, &qs, &ks, &vs);
        let m = tensor_file_error(read_attn_input(&path, Layout::Bshd));
        assert!(m.contains(want), "{name}: {m}");
    }
    // The same file read in the other layout swaps the inferred sequence and head counts.
    let path = qkv_file(
        dir.path(),
        "ok",
        &[1, 4, 2, 64],
        &[1, 6, 2, 64],
        &[1, 6, 2, 64],
    );
    let a = read_attn_input(&path, Layout::Bshd).unwrap().params;
    let b = read_attn_input(&path, Layout::Bhsd).unwrap().params;
    assert_eq!(
        (a.seqlen_q, a.heads_q, a.seqlen_k, a.heads_kv),
        (4, 2, 6, 2)
    );
    assert_eq!(
        (b.seqlen_q, b.heads_q, b.seqlen_k, b.heads_kv),
        (2, 4, 2, 6)
    );
}

#[test]
fn tensor_data_helpers() {
    let d = TensorData::Bf16(vec![bf16::from_f32(2.0), bf16::from_f32(-0.5)]);
    assert_eq!(d.len(), 2);
    assert_eq!(d.dtype_name(), "BF16");
    assert_eq!(d.attention_dtype(), Some(DType::Bf16));
    assert_eq!(d.to_f64(), vec![2.0, -0.5]);
    assert_eq!(TensorData::F32(vec![]).attention_dtype(), None);
}
