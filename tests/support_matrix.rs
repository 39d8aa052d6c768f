//! `docs/support.md` is generated from the variant table: this test fails when they disagree.
//! `WRITE_SUPPORT_MATRIX=1 cargo test --release --test support_matrix` rewrites the file.

#[test]
fn support_matrix_matches_the_variant_table() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/support.md");
    let generated = flashcore::kernels::table::support_matrix();
    if std::env::var_os("WRITE_SUPPORT_MATRIX").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/support.md is not the variant table's support matrix: rerun with \
         WRITE_SUPPORT_MATRIX=1 cargo test --release --test support_matrix"
    );
}
