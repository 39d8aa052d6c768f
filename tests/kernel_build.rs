//! Every shipped kernel variant compiles with NVRTC for sm_90a (no GPU needed) into a cubin whose
//! SASS uses the tensor cores (HGMMA), TMA (UTMALDG) and never spills to local memory.

use flashcore::jit::toolkit;
use flashcore::kernels::shipped_variants;
use std::process::Command;

fn sass(cubin: &[u8], name: &str) -> String {
    let nvdisasm = toolkit::tool("nvdisasm").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.cubin"));
    std::fs::write(&path, cubin).unwrap();
    let out = Command::new(nvdisasm)
        .arg("-c")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nvdisasm failed on {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The shipped forward set, counted by hand so that a family added or lost shows: per dtype
/// (f16, bf16) and mask (causal, full), 17 families at every head dim — plain and secret-length
/// prefill, 64-row tiles, decode, varlen over a pack and over a paged cache, the four KV-cache
/// builds (counts public/secret × contiguous/paged), and softcap twins of the 128-row prefill,
/// both varlen builds and the four KV-cache builds — and 5 at d64 only (split 2 and 4, secret-length split 2 and 4, 192 rows); plus, per
/// dtype, d128 non-causal at 176 keys and d256 at 80 keys (causal and not), each in 64- and
/// 128-row tiles. A new head dim changes only `SUPPORTED_HEAD_DIMS`.
fn expected_variants() -> usize {
    2 * (2 * (17 * flashcore::spec::SUPPORTED_HEAD_DIMS.len() + 5) + 2 + 4)
}

#[test]
fn every_variant_compiles_to_hgmma_without_spills() {
    let variants = shipped_variants();
    assert_eq!(variants.len(), expected_variants());
    for v in variants {
        let cubin = v.cubin().unwrap_or_else(|e| panic!("{}: {e}", v.name()));
        let text = sass(&cubin, &v.name());
        let count = |op: &str| text.lines().filter(|l| l.contains(op)).count();
        eprintln!(
            "compiled {}: {} bytes, HGMMA {}, UTMALDG {}, MUFU.EX2 {}",
            v.name(),
            cubin.len(),
            count("HGMMA"),
            count("UTMALDG"),
            count("MUFU.EX2")
        );
        assert!(count("HGMMA") > 0, "{}: no HGMMA in SASS", v.name());
        assert!(count("UTMALDG") > 0, "{}: no TMA loads in SASS", v.name());
        assert_eq!(count("LDL"), 0, "{}: local-memory loads (spills)", v.name());
        assert_eq!(
            count("STL"),
            0,
            "{}: local-memory stores (spills)",
            v.name()
        );
    }
}

#[test]
fn variant_names_are_distinct() {
    let mut names: Vec<String> = shipped_variants().iter().map(|v| v.name()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), expected_variants());
}

#[test]
fn compile_error_is_reported_with_the_log() {
    let bad = "extern \"C\" __global__ void k() { this is not cuda; }";
    match flashcore::jit::compile_cached("broken", bad, &[], &flashcore::jit::base_options()) {
        Err(flashcore::Error::Compile { kernel, log }) => {
            assert_eq!(kernel, "broken");
            assert!(log.contains("error"), "{log}");
        }
        other => panic!("expected a compile error, got {:?}", other.map(|c| c.len())),
    }
}

#[test]
fn every_variant_fits_in_shared_memory() {
    for v in shipped_variants() {
        let bytes = v.tile().smem_bytes(v.head_dim);
        assert!(
            bytes <= flashcore::kernels::MAX_SMEM_BYTES,
            "{}: {bytes} bytes of shared memory",
            v.name()
        );
    }
}

/// The light-tile rule: 64-row tiles exactly when their work units fit in one wave;
/// secret-length and split builds keep their tiles; every variant it picks is shipped.
#[test]
fn light_tiles_only_when_one_wave_of_64_row_units_fits() {
    use flashcore::kernels::Variant;
    use flashcore::DType;
    let sms = 132;
    let v = |causal, sq| Variant::for_shape(DType::F16, 64, causal, false, sq, sq);
    // 1,8,512: 8 heads × 8 tiles = 64 units.
    assert_eq!(v(false, 512).with_light_tiles(1, 8, 512, sms).block_m, 64);
    // Batch 3 of the same: 192 units > 132 SMs.
    assert_eq!(v(false, 512).with_light_tiles(3, 8, 512, sms).block_m, 128);
    // Causal pairs two tiles per unit: 1,16,1024 has 16 × 16 tiles in 128 units.
    assert_eq!(v(true, 1024).with_light_tiles(1, 16, 1024, sms).block_m, 64);
    assert_eq!(
        v(false, 1024).with_light_tiles(1, 16, 1024, sms).block_m,
        192
    );
    // Exactly one wave, and one unit more.
    assert_eq!(v(false, 64).with_light_tiles(1, 132, 64, sms).block_m, 64);
    assert_eq!(v(false, 64).with_light_tiles(1, 133, 64, sms).block_m, 128);
    // Secret-length builds keep their tiles.
    let slen = Variant::for_shape(DType::F16, 64, false, true, 512, 512);
    assert_eq!(slen.with_light_tiles(1, 8, 512, sms).block_m, 128);
    let shipped = shipped_variants();
    for d in flashcore::spec::SUPPORTED_HEAD_DIMS {
        for causal in [false, true] {
            for dtype in [DType::F16, DType::Bf16] {
                let light = Variant::for_shape(dtype, d, causal, false, 100, 100)
                    .with_light_tiles(1, 1, 100, sms);
                assert_eq!(light.block_m, 64);
                assert!(shipped.contains(&light), "{} is not shipped", light.name());
            }
        }
    }
}
