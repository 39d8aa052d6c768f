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

/// The head-dim lists the Python package exports come from the table's rows; the table's rows
/// built "at every head dim" come from the spec's lists. The two must agree, so a head dim is
/// added in one place.
#[test]
fn the_tables_head_dims_are_the_specs() {
    use flashcore::kernels::table;
    assert_eq!(
        table::forward_head_dims(),
        flashcore::spec::SUPPORTED_HEAD_DIMS
    );
    assert_eq!(
        table::backward_head_dims(|_| true),
        flashcore::spec::BACKWARD_HEAD_DIMS
    );
    for f in table::BACKWARD {
        for d in f.head_dims() {
            assert!(table::forward_head_dims().contains(d), "{}: d{d}", f.name);
        }
    }
}
