#[test]
fn nvrtc_builds_a_trivial_kernel() {
    let src = r#"extern "C" __global__ void k(float* o, const float* a) { o[threadIdx.x] = a[threadIdx.x] * 2.0f; }"#;
    let cubin =
        flashcore::jit::compile_cached("k", src, &[], &flashcore::jit::base_options()).unwrap();
    assert!(cubin.len() > 100);
    std::fs::write("/tmp/scratch/k.cubin", &cubin).unwrap();
}
