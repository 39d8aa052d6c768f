//! flashcore through candle on the GPU: every output checked against flashcore's float64
//! reference (relative L2: fp16 ≤ 2e-3, bf16 ≤ 1e-2, no NaN) with outputs poisoned before each
//! launch, and against candle's own matmul-softmax attention (f32). Skips visibly without a
//! usable sm_90 GPU; FLASHCORE_REQUIRE_GPU=1 makes that a failure.

use candle_core::{DType, Device, IndexOp, Tensor};
use flashcore::attention::{AttentionParams, DType as FcDType, Layout};
use flashcore::reference;
use flashcore_candle::naive::matmul_softmax_attention;
use flashcore_candle::*;
use rand::{Rng, SeedableRng};

fn gpu(test: &str) -> Option<Device> {
    let probe = flashcore::attention::external::ExternalContext::new(0)
        .map_err(|e| e.to_string())
        .and_then(|_| Device::new_cuda(0).map_err(|e| e.to_string()));
    match probe {
        Ok(d) => {
            poison_outputs(true);
            Some(d)
        }
        Err(e) => {
            if std::env::var("FLASHCORE_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("{test}: FLASHCORE_REQUIRE_GPU=1 but no usable GPU: {e}");
            }
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: no usable GPU ({e}); set FLASHCORE_REQUIRE_GPU=1 to make this a failure"
            );
            None
        }
    }
}

fn rng(test: &str) -> rand::rngs::StdRng {
    let seed = std::env::var("FLASHCORE_SEED")
        .map(|s| s.parse().expect("FLASHCORE_SEED"))
        .unwrap_or_else(|_| rand::rng().random());
    eprintln!("{test}: seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Standard-normal values, rounded to `dt`, on `dev`.
fn randn(rng: &mut impl Rng, shape: &[usize], dt: DType, dev: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let x: Vec<f32> = (0..n)
        .map(|_| {
            let u1: f64 = rng.random::<f64>().max(1e-300);
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect();
    Tensor::from_vec(x, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dt)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// Every element, in index order, as f64.
fn host(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn tol(dt: DType) -> f64 {
    if dt == DType::F16 {
        2e-3
    } else {
        1e-2
    }
}

fn fc(dt: DType) -> FcDType {
    if dt == DType::F16 {
        FcDType::F16
    } else {
        FcDType::Bf16
    }
}

fn check(name: &str, got: &Tensor, want: &[f64], dt: DType) {
    reference::check_close(name, &host(got), want, tol(dt)).unwrap_or_else(|e| panic!("{e}"));
}

struct Case {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
}

const DENSE: [Case; 6] = [
    Case {
        b: 1,
        sq: 1,
        sk: 1,
        hq: 4,
        hkv: 4,
        d: 64,
    },
    Case {
        b: 2,
        sq: 17,
        sk: 17,
        hq: 8,
        hkv: 2,
        d: 128,
    },
    Case {
        b: 1,
        sq: 1000,
        sk: 1000,
        hq: 4,
        hkv: 1,
        d: 64,
    },
    Case {
        b: 2,
        sq: 17,
        sk: 1000,
        hq: 6,
        hkv: 2,
        d: 128,
    },
    Case {
        b: 1,
        sq: 1000,
        sk: 17,
        hq: 2,
        hkv: 2,
        d: 64,
    },
    Case {
        b: 3,
        sq: 1,
        sk: 1000,
        hq: 8,
        hkv: 1,
        d: 128,
    },
];

#[test]
fn gpu_dense_matches_reference_and_candle() {
    let Some(dev) = gpu("gpu_dense_matches_reference_and_candle") else {
        return;
    };
    let mut rng = rng("gpu_dense");
    for c in &DENSE {
        for dt in [DType::F16, DType::BF16] {
            for causal in [false, true] {
                let name = format!(
                    "b{} sq{} sk{} hq{} hkv{} d{} {dt:?} causal={causal}",
                    c.b, c.sq, c.sk, c.hq, c.hkv, c.d
                );
                let q = randn(&mut rng, &[c.b, c.sq, c.hq, c.d], dt, &dev);
                let k = randn(&mut rng, &[c.b, c.sk, c.hkv, c.d], dt, &dev);
                let v = randn(&mut rng, &[c.b, c.sk, c.hkv, c.d], dt, &dev);
                let scale = 1.0 / (c.d as f32).sqrt();
                let out = flash_attn(&q, &k, &v, scale, causal).unwrap();
                assert_eq!(out.dims(), q.dims(), "{name}");
                assert_eq!(out.dtype(), dt);
                let mut p = AttentionParams::new(c.b, c.hq, c.sq, c.d)
                    .seqlen_k(c.sk)
                    .dtype(fc(dt))
                    .layout(Layout::Bshd)
                    .causal(causal)
                    .scale(scale);
                p.heads_kv = c.hkv;
                let want = reference::attention_f64(&p, &host(&q), &host(&k), &host(&v));
                check(&format!("{name} vs f64"), &out, &want.out, dt);
                // candle's attention gives NaN rows where nothing is visible (sq > sk, causal).
                if !(causal && c.sq > c.sk) {
                    let naive =
                        matmul_softmax_attention(&q, &k, &v, scale, causal, DType::F32).unwrap();
                    let err = reference::rel_l2(&host(&out), &host(&naive));
                    assert!(err <= tol(dt), "{name} vs candle: rel L2 {err}");
                }
            }
        }
    }
}

#[test]
fn gpu_views_are_read_in_place_or_copied() {
    let Some(dev) = gpu("gpu_views_are_read_in_place_or_copied") else {
        return;
    };
    let mut rng = rng("gpu_views");
    let (b, s, h, d) = (2, 300, 4, 64);
    for dt in [DType::F16, DType::BF16] {
        // A fused QKV projection [b, s, 3h, d]: q, k, v as narrowed views (read in place).
        let qkv = randn(&mut rng, &[b, s, 3 * h, d], dt, &dev);
        let q = qkv.narrow(2, 0, h).unwrap();
        let k = qkv.narrow(2, h, h).unwrap();
        let v = qkv.narrow(2, 2 * h, h).unwrap();
        assert!(!needs_copy(q.layout()) && !needs_copy(v.layout()));
        let out = flash_attn(&q, &k, &v, 0.125, true).unwrap();
        let p = AttentionParams::new(b, h, s, d)
            .dtype(fc(dt))
            .causal(true)
            .scale(0.125);
        let want = reference::attention_f64(&p, &host(&q), &host(&k), &host(&v));
        check("fused qkv views", &out, &want.out, dt);
        // [b, h, s, d] tensors transposed to [b, s, h, d] (read in place).
        let qt = randn(&mut rng, &[b, h, s, d], dt, &dev)
            .transpose(1, 2)
            .unwrap();
        let kt = randn(&mut rng, &[b, h, s, d], dt, &dev)
            .transpose(1, 2)
            .unwrap();
        let out = flash_attn(&qt, &kt, &kt, 0.125, false).unwrap();
        let p = AttentionParams::new(b, h, s, d).dtype(fc(dt)).scale(0.125);
        let want = reference::attention_f64(&p, &host(&qt), &host(&kt), &host(&kt));
        check("transposed views", &out, &want.out, dt);
        // A K/V head broadcast over the query heads (copied once, then read).
        let k1 = randn(&mut rng, &[b, s, 1, d], dt, &dev);
        let kb = k1.broadcast_as((b, s, h, d)).unwrap();
        assert!(needs_copy(kb.layout()));
        let out = flash_attn(&qt, &kb, &kb, 0.125, false).unwrap();
        let want = reference::attention_f64(&p, &host(&qt), &host(&kb), &host(&kb));
        check("broadcast k/v", &out, &want.out, dt);
    }
}

#[test]
fn gpu_windows_and_softcap() {
    let Some(dev) = gpu("gpu_windows_and_softcap") else {
        return;
    };
    let mut rng = rng("gpu_windows");
    let (b, sq, sk, h, d) = (2, 200, 333, 4, 128);
    let dt = DType::BF16;
    let q = randn(&mut rng, &[b, sq, h, d], dt, &dev);
    let k = randn(&mut rng, &[b, sk, h, d], dt, &dev);
    let v = randn(&mut rng, &[b, sk, h, d], dt, &dev);
    for (left, right, cap) in [
        (Some(50), Some(0), 0.0),
        (Some(20), Some(7), 0.0),
        (None, None, 5.0),
    ] {
        let out =
            flash_attn_alibi_windowed_softcap(&q, &k, &v, None, 0.08, left, right, cap).unwrap();
        let spec = DenseSpec::new(&q, &k, &v, 0.08, left, right, cap).unwrap();
        let want = reference::attention_f64(&spec.params, &host(&q), &host(&k), &host(&v));
        check(
            &format!("window {left:?} {right:?} softcap {cap}"),
            &out,
            &want.out,
            dt,
        );
    }
}

#[test]
fn gpu_on_a_device_with_its_own_stream() {
    let Some(_) = gpu("gpu_on_a_device_with_its_own_stream") else {
        return;
    };
    let dev = Device::new_cuda_with_stream(0).unwrap();
    let mut rng = rng("gpu_stream");
    let dt = DType::F16;
    let q = randn(&mut rng, &[4, 1000, 8, 64], dt, &dev);
    let k = randn(&mut rng, &[4, 1000, 8, 64], dt, &dev);
    // Work queued on the device's stream right before: the op must run after it, on that stream.
    let v = (randn(&mut rng, &[4, 1000, 8, 64], dt, &dev) * 0.5).unwrap();
    let out = flash_attn(&q, &k, &v, 0.125, true).unwrap();
    let p = AttentionParams::new(4, 8, 1000, 64)
        .causal(true)
        .scale(0.125);
    let want = reference::attention_f64(&p, &host(&q), &host(&k), &host(&v));
    check("own stream", &out, &want.out, dt);
    // Tensors of two candle devices (even on one GPU) are refused, as candle's own ops do.
    let other = Device::new_cuda_with_stream(0).unwrap();
    let k2 = k
        .to_device(&Device::Cpu)
        .unwrap()
        .to_device(&other)
        .unwrap();
    let e = flash_attn(&q, &k2, &v, 0.125, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("all tensors must be on one device"), "{e}");
}

#[test]
fn gpu_varlen_matches_reference() {
    let Some(dev) = gpu("gpu_varlen_matches_reference") else {
        return;
    };
    let mut rng = rng("gpu_varlen");
    let lens_q = [1usize, 17, 300, 64];
    let lens_k = [5usize, 17, 1000, 40];
    let cu = |l: &[usize]| {
        let mut c = vec![0u32];
        for &x in l {
            c.push(c.last().unwrap() + x as u32);
        }
        c
    };
    let (cq, ck) = (cu(&lens_q), cu(&lens_k));
    let (tq, tk) = (*cq.last().unwrap() as usize, *ck.last().unwrap() as usize);
    for dt in [DType::F16, DType::BF16] {
        for causal in [false, true] {
            for (hq, hkv, d) in [(8, 2, 64), (4, 4, 128)] {
                let q = randn(&mut rng, &[tq, hq, d], dt, &dev);
                let k = randn(&mut rng, &[tk, hkv, d], dt, &dev);
                let v = randn(&mut rng, &[tk, hkv, d], dt, &dev);
                let sq = Tensor::new(cq.as_slice(), &dev).unwrap();
                let sk = Tensor::new(ck.as_slice(), &dev).unwrap();
                let scale = 1.0 / (d as f32).sqrt();
                let out =
                    flash_attn_varlen(&q, &k, &v, &sq, &sk, 300, 1000, scale, causal).unwrap();
                assert_eq!(out.dims(), &[tq, hq, d]);
                let mut p = AttentionParams::new(4, hq, 300, d)
                    .seqlen_k(1000)
                    .dtype(fc(dt))
                    .causal(causal)
                    .scale(scale);
                p.heads_kv = hkv;
                let ci = |c: &[u32]| c.iter().map(|&x| x as i32).collect::<Vec<_>>();
                let want =
                    reference::varlen_f64(&p, &ci(&cq), &ci(&ck), &host(&q), &host(&k), &host(&v));
                let name = format!("varlen {dt:?} causal={causal} hq{hq} hkv{hkv} d{d}");
                check(&name, &out, &want.out, dt);
                // The same through candle's attention, one sequence at a time (i32 lengths too).
                let out_i = flash_attn_varlen(
                    &q,
                    &k,
                    &v,
                    &Tensor::new(ci(&cq).as_slice(), &dev).unwrap(),
                    &Tensor::new(ci(&ck).as_slice(), &dev).unwrap(),
                    300,
                    1000,
                    scale,
                    causal,
                )
                .unwrap();
                for (i, (&lq, &lk)) in lens_q.iter().zip(&lens_k).enumerate() {
                    if causal && lq > lk {
                        continue;
                    }
                    let qs = q
                        .narrow(0, cq[i] as usize, lq)
                        .unwrap()
                        .unsqueeze(0)
                        .unwrap();
                    let ks = k
                        .narrow(0, ck[i] as usize, lk)
                        .unwrap()
                        .unsqueeze(0)
                        .unwrap();
                    let vs = v
                        .narrow(0, ck[i] as usize, lk)
                        .unwrap()
                        .unsqueeze(0)
                        .unwrap();
                    let naive =
                        matmul_softmax_attention(&qs, &ks, &vs, scale, causal, DType::F32).unwrap();
                    let got = out_i.narrow(0, cq[i] as usize, lq).unwrap();
                    let err = reference::rel_l2(&host(&got), &host(&naive));
                    assert!(err <= tol(dt), "{name} seq {i} vs candle: rel L2 {err}");
                }
            }
        }
    }
}

/// A KV-cache step: new rows appended in place, attention over `counts + n` keys, checked
/// against the reference on the host's copy of the updated cache and against the cache itself.
#[test]
fn gpu_kvcache_append_contiguous_and_paged() {
    let Some(dev) = gpu("gpu_kvcache_append_contiguous_and_paged") else {
        return;
    };
    let mut rng = rng("gpu_kvcache");
    let (b, cap, hq, hkv) = (3usize, 512usize, 8usize, 2usize);
    let counts = [0usize, 17, 500];
    for dt in [DType::F16, DType::BF16] {
        for (sq, n, d, paged) in [
            (1, 1, 128, false),
            (4, 4, 64, false),
            (1, 1, 64, true),
            (3, 2, 128, true),
        ] {
            let q = randn(&mut rng, &[b, sq, hq, d], dt, &dev);
            let knew = randn(&mut rng, &[b, n, hkv, d], dt, &dev);
            let vnew = randn(&mut rng, &[b, n, hkv, d], dt, &dev);
            let page = 16;
            let per_seq = cap / page;
            // Pages of each sequence scattered over the pool by a permutation.
            let num_pages = b * per_seq + 5;
            let mut perm: Vec<u32> = (0..num_pages as u32).collect();
            for i in (1..perm.len()).rev() {
                perm.swap(i, rng.random_range(0..=i));
            }
            let table: Vec<u32> = perm[..b * per_seq].to_vec();
            let (kc, vc) = if paged {
                (
                    randn(&mut rng, &[num_pages, page, hkv, d], dt, &dev),
                    randn(&mut rng, &[num_pages, page, hkv, d], dt, &dev),
                )
            } else {
                (
                    randn(&mut rng, &[b, cap, hkv, d], dt, &dev),
                    randn(&mut rng, &[b, cap, hkv, d], dt, &dev),
                )
            };
            // The logical [b, cap, hkv, d] caches on the host, before the append.
            let logical = |c: &Tensor| -> Vec<f64> {
                let x = host(c);
                if !paged {
                    return x;
                }
                let row = hkv * d;
                let mut out = Vec::with_capacity(b * cap * row);
                for s in 0..b {
                    for r in 0..cap {
                        let pg = table[s * per_seq + r / page] as usize;
                        let at = (pg * page + r % page) * row;
                        out.extend_from_slice(&x[at..at + row]);
                    }
                }
                out
            };
            let (mut hk, mut hv) = (logical(&kc), logical(&vc));
            let (kn, vn) = (host(&knew), host(&vnew));
            let row = hkv * d;
            for (s, &count) in counts.iter().enumerate() {
                for i in 0..n {
                    let r = count + i;
                    let dst = (s * cap + r) * row;
                    let src = (s * n + i) * row;
                    hk[dst..dst + row].copy_from_slice(&kn[src..src + row]);
                    hv[dst..dst + row].copy_from_slice(&vn[src..src + row]);
                }
            }
            let lens: Vec<u32> = counts.iter().map(|&c| c as u32).collect();
            let lens = Tensor::new(lens.as_slice(), &dev).unwrap();
            let tbl = Tensor::from_vec(table.clone(), (b, per_seq), &dev).unwrap();
            let scale = 1.0 / (d as f32).sqrt();
            let out = flash_attn_with_kvcache(
                &q,
                &kc,
                &vc,
                Some(&knew),
                Some(&vnew),
                &lens,
                paged.then_some(&tbl),
                scale,
                true,
            )
            .unwrap();
            let mut p = AttentionParams::new(b, hq, sq, d)
                .seqlen_k(cap)
                .dtype(fc(dt))
                .causal(true)
                .scale(scale);
            p.heads_kv = hkv;
            let after: Vec<usize> = counts.iter().map(|&c| c + n).collect();
            let want = reference::kv_cache_f64(&p, &host(&q), &hk, &hv, &after);
            let name = format!("kvcache {dt:?} sq{sq} n{n} d{d} paged={paged}");
            check(&name, &out, &want.out, dt);
            // The append wrote the new rows into the caches themselves.
            assert_eq!(logical(&kc), hk, "{name}: k_cache after the append");
            assert_eq!(logical(&vc), hv, "{name}: v_cache after the append");
            // Without new rows: attention over the counts as they are now (i32 counts).
            let lens_i = Tensor::new(
                after
                    .iter()
                    .map(|&c| c as i32)
                    .collect::<Vec<_>>()
                    .as_slice(),
                &dev,
            )
            .unwrap();
            let out2 = flash_attn_with_kvcache(
                &q,
                &kc,
                &vc,
                None,
                None,
                &lens_i,
                paged.then_some(&tbl),
                scale,
                true,
            )
            .unwrap();
            check(&format!("{name} no append"), &out2, &want.out, dt);
            // And against candle's attention on the live keys of the last sequence (contiguous).
            if !paged {
                let s = b - 1;
                let keys = after[s];
                let ks = kc
                    .i(s)
                    .unwrap()
                    .narrow(0, 0, keys)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let vs = vc
                    .i(s)
                    .unwrap()
                    .narrow(0, 0, keys)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let qs = q.i(s).unwrap().unsqueeze(0).unwrap();
                let naive =
                    matmul_softmax_attention(&qs, &ks, &vs, scale, true, DType::F32).unwrap();
                let err = reference::rel_l2(&host(&out.i(s).unwrap()), &host(&naive));
                assert!(err <= tol(dt), "{name} vs candle: rel L2 {err}");
            }
        }
    }
}

/// Two threads running varlen on candle's per-thread default stream at once: each thread's
/// stream has its own work list (flashcore keys the varlen module by thread for that stream).
#[test]
fn gpu_varlen_from_two_threads() {
    let Some(dev) = gpu("gpu_varlen_from_two_threads") else {
        return;
    };
    let seed: u64 = rng("gpu_varlen_threads").random();
    let run = move |t: u64, dev: Device| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed + t);
        // Different lengths per thread, so a shared work list would give wrong rows.
        let lens: Vec<usize> = if t == 0 {
            vec![700, 3, 129]
        } else {
            vec![5, 1000]
        };
        let mut cu = vec![0u32];
        for &l in &lens {
            cu.push(cu.last().unwrap() + l as u32);
        }
        let total = *cu.last().unwrap() as usize;
        let q = randn(&mut rng, &[total, 4, 64], DType::F16, &dev);
        let k = randn(&mut rng, &[total, 4, 64], DType::F16, &dev);
        let v = randn(&mut rng, &[total, 4, 64], DType::F16, &dev);
        let cut = Tensor::new(cu.as_slice(), &dev).unwrap();
        let max = *lens.iter().max().unwrap();
        let p = AttentionParams::new(lens.len(), 4, max, 64)
            .causal(true)
            .scale(0.125);
        let ci: Vec<i32> = cu.iter().map(|&x| x as i32).collect();
        let want = reference::varlen_f64(&p, &ci, &ci, &host(&q), &host(&k), &host(&v));
        for _ in 0..30 {
            let out = flash_attn_varlen(&q, &k, &v, &cut, &cut, max, max, 0.125, true).unwrap();
            check(&format!("thread {t}"), &out, &want.out, DType::F16);
        }
    };
    let d1 = dev.clone();
    let a = std::thread::spawn(move || run(0, d1));
    let b = std::thread::spawn(move || run(1, dev));
    a.join().unwrap();
    b.join().unwrap();
}
