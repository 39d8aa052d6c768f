//! `docs/performance.md` is generated from the benchmark records `bench/results/current.json`
//! names: this test fails when the committed page is not what they generate.
//! `WRITE_PERFORMANCE_PAGE=1 cargo test --release --test performance_page` rewrites it (as does
//! `flashcore perf-page --out docs/performance.md`).

#[test]
fn performance_page_matches_the_records() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated =
        flashcore::bench::page::render_from(&root.join("bench/results/current.json")).unwrap();
    let path = root.join("docs/performance.md");
    if std::env::var_os("WRITE_PERFORMANCE_PAGE").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/performance.md is not what the benchmark records generate: rerun with \
         WRITE_PERFORMANCE_PAGE=1 cargo test --release --test performance_page"
    );
}
