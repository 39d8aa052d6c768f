//! Public buffers (docs/design.md §1 "Metadata"): the audit is told which kernel parameters
//! (or pointer fields of a struct parameter) point at public metadata — a paged KV cache's block
//! table, `cache_seqlens` — and proves that only those buffers' contents reach addresses and
//! branches. Each kernel of tests/audit_corpus/public_buffers.cu is audited with and without the
//! declaration, and every verdict is asserted by its witness: the rule, the instruction, and the
//! load the taint chain starts from. Then the API (`audit_cubin_with`, `audit_variant`) and every
//! error path of `--public-param`.
//!
//! Needs NVRTC and nvdisasm (`bash scripts/install-cuda-tools.sh`); fails, never skips, without.

mod common;
use common::flashcore;
use flashcore::audit::{self, sass, Declared, Finding, KernelAudit, PublicBuffer, Rule};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::OnceLock;

const FILE: &str = "public_buffers.cu";

fn path() -> String {
    format!("{}/tests/audit_corpus/{FILE}", env!("CARGO_MANIFEST_DIR"))
}

fn source() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| std::fs::read_to_string(path()).unwrap_or_else(|e| panic!("{FILE}: {e}")))
}

fn cubin() -> &'static [u8] {
    static C: OnceLock<Vec<u8>> = OnceLock::new();
    C.get_or_init(|| {
        flashcore::jit::compile_cached(FILE, source(), &[], &flashcore::jit::base_options())
            .unwrap_or_else(|e| panic!("compiling {FILE}: {e}"))
    })
}

fn sections() -> &'static HashMap<String, sass::Section> {
    static S: OnceLock<HashMap<String, sass::Section>> = OnceLock::new();
    S.get_or_init(|| {
        let listing = audit::disassemble(cubin()).unwrap_or_else(|e| panic!("{e}"));
        sass::parse_listing(&listing)
            .into_iter()
            .map(|s| (s.kernel.clone(), s))
            .collect()
    })
}

/// Audits `kernel` with the pointers `public` names public (`--public-param` specs, names read
/// from the source's signature).
fn audit(kernel: &str, public: &[&str]) -> KernelAudit {
    let sel = audit::Selection {
        kernel: Some(kernel.into()),
        public: public.iter().map(|s| s.parse().unwrap()).collect(),
        signatures: Some(audit::signature::parse_signatures(source())),
        ..Default::default()
    };
    let mut v = audit::audit_cubin_selected(cubin(), &sel)
        .unwrap_or_else(|e| panic!("auditing {kernel} {public:?}: {e}"));
    assert_eq!(v.len(), 1);
    v.remove(0)
}

fn insn_at(kernel: &str, offset: u32) -> &'static sass::Insn {
    sections()[kernel]
        .insns
        .iter()
        .find(|i| i.offset == offset)
        .unwrap_or_else(|| panic!("{kernel}: no instruction at {offset:#x}"))
}

fn only_buffer(a: &KernelAudit) -> &PublicBuffer {
    assert_eq!(a.public_buffers.len(), 1, "{:#?}", a.public_buffers);
    &a.public_buffers[0]
}

/// The findings of `a` as (rule, base opcode, offset).
fn verdicts(a: &KernelAudit) -> Vec<(Rule, String, u32)> {
    a.findings
        .iter()
        .map(|f| {
            let op = f
                .text
                .split_whitespace()
                .find(|t| !t.starts_with('@'))
                .and_then(|t| t.split('.').next())
                .unwrap_or("")
                .to_string();
            (f.rule, op, f.offset)
        })
        .collect()
}

fn chain_start(f: &Finding) -> u32 {
    f.chain.first().map(|s| s.offset).expect("a taint chain")
}

fn clean(a: &KernelAudit) {
    assert!(a.findings.is_empty(), "{}: {:#?}", a.name, a.findings);
}

/// (a) The page index comes from the block table: clean when it is public; otherwise rule 2 at
/// the K load, whose chain starts at the block-table load.
#[test]
fn paged_gather_is_clean_only_with_the_block_table_public() {
    let k = "pb_paged_gather";
    let public = audit(k, &["block_table"]);
    clean(&public);
    let b = only_buffer(&public);
    assert_eq!((b.start, b.end, b.param), (0x210, 0x218, Some(0)));
    assert_eq!(b.public_loads.len(), 1, "{b:#?}");
    assert!(
        b.unproven_loads.is_empty() && b.writes.is_empty() && b.secret_address_loads.is_empty()
    );
    let bt_load = b.public_loads[0];
    assert_eq!(insn_at(k, bt_load).op(), "LDG");
    // The same by ordinal.
    assert_eq!(audit(k, &["0"]).public_buffers, public.public_buffers);

    let secret = audit(k, &[]);
    assert!(secret.public_buffers.is_empty());
    let v = verdicts(&secret);
    assert_eq!(v.len(), 1, "{v:?}");
    let (rule, op, at) = &v[0];
    assert_eq!((rule, op.as_str()), (&Rule::MemoryAddress, "LDG"));
    assert_ne!(
        *at, bt_load,
        "the finding is at the K load, not the block-table load"
    );
    assert_eq!(chain_start(&secret.findings[0]), bt_load);
}

/// (b) A page index derived from K's bytes is flagged even with the block table public.
#[test]
fn page_index_from_k_is_flagged_with_the_block_table_public() {
    let k = "pb_page_from_k";
    let a = audit(k, &["block_table"]);
    let b = only_buffer(&a);
    assert_eq!(
        b.public_loads.len(),
        1,
        "the block table is really read: {b:#?}"
    );
    let v = verdicts(&a);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].0, v[0].1.as_str()), (Rule::MemoryAddress, "LDG"));
    let src = insn_at(k, chain_start(&a.findings[0]));
    assert!(
        src.opcode.starts_with("LDG.E.U8"),
        "the chain starts at the load of K's byte: {}",
        src.text
    );
    assert!(!b.public_loads.contains(&v[0].2) && !b.public_loads.contains(&src.offset));
}

/// (j, k) The KV-cache append's shape (kernels/fc_kv_append.cuh): rows addressed by the counts,
/// K's values moved. Clean with the counts public; rule 2 at the store, its chain from the counts'
/// load, without. A row taken from K's own data is flagged at the store even with the counts
/// public, its chain starting at K's load.
#[test]
fn kv_append_rows_are_clean_only_when_addressed_by_public_counts() {
    let k = "pb_append_rows";
    let public = audit(k, &["cache_seqlens"]);
    clean(&public);
    let counts_load = only_buffer(&public).public_loads.clone();
    assert_eq!(counts_load.len(), 1, "{counts_load:?}");
    let secret = audit(k, &[]);
    let v = verdicts(&secret);
    let store = secret
        .findings
        .iter()
        .zip(&v)
        .find(|(_, (rule, op, _))| *rule == Rule::MemoryAddress && op == "STG")
        .unwrap_or_else(|| panic!("the store's address is secret without the declaration: {v:?}"));
    assert_eq!(chain_start(store.0), counts_load[0]);

    let k = "pb_append_row_from_k";
    let a = audit(k, &["cache_seqlens"]);
    let b = only_buffer(&a);
    assert_eq!(
        b.public_loads.len(),
        1,
        "the counts are really read: {b:#?}"
    );
    let v = verdicts(&a);
    let store = a
        .findings
        .iter()
        .zip(&v)
        .find(|(_, (rule, op, _))| *rule == Rule::MemoryAddress && op == "STG")
        .unwrap_or_else(|| panic!("a row from K's data must be flagged: {v:?}"));
    let src = insn_at(k, chain_start(store.0));
    assert!(
        src.opcode.starts_with("LDG") && !b.public_loads.contains(&src.offset),
        "the chain starts at the load of K's value: {}",
        src.text
    );
}

/// (c) A loop bounded by `cache_seqlens[b]`: clean when it is public, rule 1 at the loop's
/// branches (chains from the length load) when not.
#[test]
fn seqlen_loop_bound_is_clean_only_when_public() {
    let k = "pb_seqlen_loop";
    let public = audit(k, &["cache_seqlens"]);
    clean(&public);
    let [len_load] = only_buffer(&public).public_loads[..] else {
        panic!("{:#?}", public.public_buffers)
    };
    assert_eq!(public.resources.branches_secret, 0);
    assert!(public.resources.branches_public >= 2);

    let secret = audit(k, &[]);
    assert!(!secret.findings.is_empty());
    for (f, (rule, op, _)) in secret.findings.iter().zip(verdicts(&secret)) {
        assert_eq!((rule, op.as_str()), (Rule::ControlFlow, "BRA"), "{f:#?}");
        assert_eq!(chain_start(f), len_load);
    }
    assert_eq!(
        secret.resources.branches_secret,
        public.resources.branches_public
    );
}

/// (d) A public base with a secret offset: rule 2 at the block-table load, and its value stays
/// secret (rule 1 at the loop it bounds, through that load).
#[test]
fn public_base_with_secret_offset_is_flagged_and_its_value_stays_secret() {
    let k = "pb_secret_offset";
    let a = audit(k, &["block_table"]);
    let b = only_buffer(&a);
    assert!(b.public_loads.is_empty(), "{b:#?}");
    assert_eq!(b.secret_address_loads.len(), 1, "{b:#?}");
    let bt_load = b.secret_address_loads[0];
    let v = verdicts(&a);
    let at_load: Vec<&Finding> = a.findings.iter().filter(|f| f.offset == bt_load).collect();
    assert_eq!(at_load.len(), 1, "{v:?}");
    assert_eq!(at_load[0].rule, Rule::MemoryAddress);
    let k_load = chain_start(at_load[0]);
    assert_ne!(k_load, bt_load);
    assert_eq!(insn_at(k, k_load).op(), "LDG", "the offset comes from K");
    let loops: Vec<&Finding> = a
        .findings
        .iter()
        .filter(|f| f.rule == Rule::ControlFlow)
        .collect();
    assert!(!loops.is_empty(), "{v:?}");
    for f in loops {
        assert!(
            f.chain.iter().any(|s| s.offset == bt_load),
            "the loop bound's taint goes through the block-table load: {f:#?}"
        );
    }
}

/// (e) A pointer that is the block table on one path or lane and K on another: loads through it
/// are secret (rule 1 at the loop they bound), listed as not proven to read the buffer.
#[test]
fn pointers_mixing_the_public_buffer_with_k_are_not_public() {
    for (k, select) in [("pb_select_mixed", true), ("pb_merge_mixed", false)] {
        let sec = &sections()[k];
        // The case is really compiled: predicated constant-bank loads of the two pointers (a
        // select), or one constant-bank load per side of a branch and no select.
        let predicated = sec
            .insns
            .iter()
            .any(|i| i.op() == "LDC" && i.real_guard().is_some());
        let selects = sec.insns.iter().any(|i| matches!(i.op(), "SEL" | "USEL"));
        if select {
            assert!(predicated || selects, "{k}: no select of the pointers");
        } else {
            assert!(!selects && !predicated, "{k}: not a branch merge");
        }
        let a = audit(k, &["block_table"]);
        let b = only_buffer(&a);
        assert!(b.public_loads.is_empty(), "{k}: {b:#?}");
        assert_eq!(b.unproven_loads.len(), 1, "{k}: {b:#?}");
        let load = b.unproven_loads[0];
        let v = verdicts(&a);
        assert!(!v.is_empty(), "{k}");
        for f in &a.findings {
            assert_eq!(f.rule, Rule::ControlFlow, "{k}: {f:#?}");
            assert_eq!(
                chain_start(f),
                load,
                "{k}: the chain starts at the mixed load"
            );
        }
    }
    // The control: both sides into the block table.
    let a = audit("pb_merge_same", &["block_table"]);
    clean(&a);
    assert_eq!(only_buffer(&a).public_loads.len(), 1);
}

/// (f) flashcore's shape: one `__grid_constant__` struct, pointer fields declared one by one.
#[test]
fn struct_parameter_fields_are_declared_by_byte_offset() {
    let k = "pb_struct_fields";
    let both = audit(k, &["p:8", "p:0x10"]);
    clean(&both);
    let ranges: Vec<(u32, u32, Option<usize>, u32)> = both
        .public_buffers
        .iter()
        .map(|b| (b.start, b.end, b.param, b.field_offset))
        .collect();
    // The 64-byte-aligned struct starts at c[0x0][0x240].
    assert_eq!(
        ranges,
        vec![(0x248, 0x250, Some(0), 8), (0x250, 0x258, Some(0), 16)]
    );
    assert!(both
        .public_buffers
        .iter()
        .all(|b| b.public_loads.len() == 1));
    let len_load = both.public_buffers[1].public_loads[0];
    let bt_load = both.public_buffers[0].public_loads[0];

    // Only the block table: the length (loop bound) is secret, so is which pages are walked.
    let bt_only = audit(k, &["p:8"]);
    assert!(!bt_only.findings.is_empty());
    for f in &bt_only.findings {
        assert_eq!(chain_start(f), len_load, "{f:#?}");
    }
    assert!(bt_only
        .findings
        .iter()
        .any(|f| f.rule == Rule::ControlFlow && f.text.contains("BRA")));

    // Nothing declared: the K load's address comes from the block table (rule 2).
    let none = audit(k, &[]);
    assert!(none.findings.iter().any(|f| f.rule == Rule::MemoryAddress
        && f.text.starts_with("LDG")
        && chain_start(f) == bt_load));

    // The whole struct is no pointer.
    let e = audit::audit_cubin_selected(
        cubin(),
        &audit::Selection {
            kernel: Some(k.into()),
            public: vec!["p".parse().unwrap()],
            signatures: Some(audit::signature::parse_signatures(source())),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("has 64 bytes, not a pointer's 8"), "{e}");
}

/// (g) A buffer the kernel writes is not metadata: its reads stay secret.
#[test]
fn a_written_buffer_is_not_public() {
    let k = "pb_writes_table";
    let a = audit(k, &["block_table"]);
    let b = only_buffer(&a);
    assert!(b.public_loads.is_empty(), "{b:#?}");
    assert_eq!(b.writes.len(), 1, "{b:#?}");
    assert_eq!(insn_at(k, b.writes[0]).op(), "STG");
    assert_eq!(b.unproven_loads.len(), 1, "the based read, demoted: {b:#?}");
    let v = verdicts(&a);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].0, v[0].1.as_str()), (Rule::MemoryAddress, "LDG"));
    assert_eq!(chain_start(&a.findings[0]), b.unproven_loads[0]);
}

/// (h) What a decode kernel looks like: reads under a bound check in an unrolled loop, 64-bit
/// strides, a vector load of four entries; (i) a predicated read.
#[test]
fn guarded_unrolled_predicated_and_vector_reads_are_public() {
    let k = "pb_guarded_unrolled";
    let a = audit(k, &["block_table", "cache_seqlens"]);
    clean(&a);
    let bt = &a.public_buffers[0];
    assert!(bt.public_loads.len() >= 5, "{bt:#?}");
    assert!(bt
        .public_loads
        .iter()
        .any(|&o| insn_at(k, o).opcode.contains(".128")));
    assert!(bt.unproven_loads.is_empty());
    assert_eq!(a.public_buffers[1].public_loads.len(), 1);
    assert!(!audit(k, &[]).findings.is_empty());

    // The read, its pointer and its address are all predicated (`@!P0 LDC.64`, `@!P0
    // IMAD.WIDE`, `@!P0 LDG`): seen under the guard, the address is the block table's.
    let k = "pb_predicated_read";
    let a = audit(k, &["block_table"]);
    clean(&a);
    let [load] = only_buffer(&a).public_loads[..] else {
        panic!("{:#?}", a.public_buffers)
    };
    assert!(insn_at(k, load).real_guard().is_some());
    let secret = audit(k, &[]);
    let v = verdicts(&secret);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].0, v[0].1.as_str()), (Rule::MemoryAddress, "LDG"));
    assert_eq!(chain_start(&secret.findings[0]), load);
}

/// The API the shipped-variant loop uses: constant-bank ranges or parameter fields, the same
/// verdicts as the flag.
#[test]
fn api_takes_constant_bank_ranges_or_fields() {
    let all = audit::audit_cubin_with(cubin(), &Declared::default()).unwrap();
    assert!(all.iter().all(|a| a.public_buffers.is_empty()));
    // Every kernel of a cubin gets the same declarations: only the struct kernel is meant for
    // these, so audit its section alone.
    let k = "pb_struct_fields";
    let sec = &sections()[k];
    let infos = audit::cubin::kernel_infos(cubin()).unwrap();
    let info = infos.get(k);
    let by_flag = audit(k, &["p:8", "p:16"]).public_buffers;
    let ranges = Declared {
        public_buffers: vec![(0x248, 0x250), (0x250, 0x258)],
        ..Default::default()
    };
    let a = audit::audit_section_with(sec, info, &ranges).unwrap();
    clean(&a);
    assert_eq!(a.public_buffers, by_flag);
    let fields = Declared {
        public_fields: vec![(0, 8), (0, 16)],
        ..Default::default()
    };
    let a = audit::audit_section_with(sec, info, &fields).unwrap();
    assert_eq!(a.public_buffers, by_flag);
    // The trap `public_fields` avoids: 0x210 + offset is not the field in a 64-aligned struct.
    let naive = Declared {
        public_buffers: vec![(0x218, 0x220), (0x220, 0x228)],
        ..Default::default()
    };
    let a = audit::audit_section_with(sec, info, &naive)
        .unwrap_err()
        .to_string();
    assert!(a.contains("not inside one parameter"), "{a}");
    // A pointer parameter is field 0 of itself.
    let pg = "pb_paged_gather";
    let a = audit::audit_section_with(
        &sections()[pg],
        infos.get(pg),
        &Declared {
            public_fields: vec![(0, 0)],
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(a.public_buffers, audit(pg, &["block_table"]).public_buffers);
    // audit_variant labels what it audits.
    let v = audit::audit_variant(cubin(), "decode_test", &Declared::default()).unwrap();
    assert!(v
        .iter()
        .all(|a| a.variant.as_deref() == Some("decode_test")));

    let refused = |decl: Declared, needle: &str| {
        let e = audit::audit_section_with(sec, info, &decl)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{decl:?}: {e}");
    };
    let ranges_of = |r: Vec<(u32, u32)>| Declared {
        public_buffers: r,
        ..Default::default()
    };
    refused(
        ranges_of(vec![(0x248, 0x24c)]),
        "8 bytes at an 8-byte-aligned offset",
    );
    refused(
        ranges_of(vec![(0x24c, 0x254)]),
        "8 bytes at an 8-byte-aligned offset",
    );
    refused(ranges_of(vec![(0x300, 0x308)]), "not inside one parameter");
    refused(
        Declared {
            secret_params: vec![0],
            public_buffers: vec![(0x248, 0x250)],
            ..Default::default()
        },
        "declared both public and secret",
    );
    refused(
        Declared {
            public_fields: vec![(0, 4)],
            ..Default::default()
        },
        "public field (0, 0x4): a pointer field is 8 bytes at an 8-byte-aligned offset",
    );
    refused(
        Declared {
            public_fields: vec![(1, 0)],
            ..Default::default()
        },
        "no parameter #1",
    );
    // A listing has no parameter layout.
    let e = audit::audit_section_with(sec, None, &ranges)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no parameter layout"), "{e}");
}

/// Runs `flashcore audit --json ARGS` on the corpus file.
fn cli(args: &[&str]) -> (i32, Vec<Value>, String) {
    let p = path();
    let mut all = vec!["audit", "--json", "--source", p.as_str()];
    all.extend_from_slice(args);
    let (code, out, err) = flashcore(&all);
    let v: Value = if code == 2 {
        Value::Array(vec![])
    } else {
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"))
    };
    (code, v.as_array().cloned().unwrap_or_default(), err)
}

fn refused(args: &[&str], needles: &[&str]) {
    let (code, out, err) = flashcore(args);
    assert_eq!(code, 2, "{args:?}: exit {code}\n{out}\n{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
}

#[test]
fn cli_public_param_by_name_ordinal_and_field() {
    let (code, ks, err) = cli(&[
        "--kernel",
        "pb_paged_gather",
        "--public-param",
        "block_table",
    ]);
    assert_eq!(code, 0, "{err}");
    let b = &ks[0]["public_buffers"][0];
    assert_eq!(
        (b["start"].as_u64(), b["end"].as_u64()),
        (Some(0x210), Some(0x218))
    );
    assert_eq!(b["param"], 0);
    assert_eq!(b["public_loads"].as_array().unwrap().len(), 1);
    let (code, _, err) = cli(&["--kernel", "pb_paged_gather"]);
    assert_eq!(code, 1, "{err}");
    let (code, ks, err) = cli(&[
        "--kernel",
        "pb_struct_fields",
        "--public-param",
        "0:8",
        "--public-param",
        "p:0x10",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ks[0]["public_buffers"].as_array().unwrap().len(), 2);
    // The table names each public buffer and its loads.
    let p = path();
    let (code, out, err) = flashcore(&[
        "audit",
        "--source",
        &p,
        "--kernel",
        "pb_secret_offset",
        "--public-param",
        "block_table",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        out.contains("pb_secret_offset: public buffer c[0x0][0x210..0x218] (parameter #0): 0 public load(s); 1 load(s) at a secret address"),
        "{out}"
    );
    // Kernels without the named parameter are audited without it (pb_struct_fields has no
    // block_table parameter).
    let (code, ks, _) = cli(&["--public-param", "block_table"]);
    assert_eq!(code, 1);
    let names = |k: &Value| k["name"].as_str().unwrap().to_string();
    let declared: Vec<String> = ks
        .iter()
        .filter(|k| !k["public_buffers"].as_array().unwrap().is_empty())
        .map(names)
        .collect();
    assert!(declared.contains(&"pb_paged_gather".to_string()));
    assert!(!declared.contains(&"pb_struct_fields".to_string()));
}

#[test]
fn cli_public_param_error_paths() {
    let p = path();
    let src = ["audit", "--source", p.as_str()];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        src.iter().copied().chain(extra.iter().copied()).collect()
    };
    // Syntax (clap rejects it before anything runs).
    refused(
        &with(&["--public-param", "p:zz"]),
        &["is not a byte offset"],
    );
    refused(
        &with(&["--public-param", "a b"]),
        &["neither a 0-based parameter ordinal"],
    );
    // A name no kernel has.
    refused(
        &with(&["--public-param", "nope"]),
        &["--public-param nope: no audited kernel has a parameter of that name"],
    );
    // An ordinal the kernel does not have.
    refused(
        &with(&["--kernel", "pb_seqlen_loop", "--public-param", "9"]),
        &["no parameter #9", "it has 4"],
    );
    // A parameter that is no pointer; a field offset that is none.
    refused(
        &with(&["--kernel", "pb_paged_gather", "--public-param", "max_pages"]),
        &["has 4 bytes, not a pointer's 8", "PARAM:OFFSET"],
    );
    refused(
        &with(&["--kernel", "pb_struct_fields", "--public-param", "p"]),
        &["has 64 bytes"],
    );
    refused(
        &with(&["--kernel", "pb_struct_fields", "--public-param", "p:4"]),
        &["8-byte-aligned"],
    );
    refused(
        &with(&["--kernel", "pb_struct_fields", "--public-param", "p:64"]),
        &["8-byte-aligned"],
    );
    // Both secret and public.
    refused(
        &with(&[
            "--kernel",
            "pb_paged_gather",
            "--public-param",
            "block_table",
            "--secret-param",
            "0",
        ]),
        &["also given with --secret-param", "not both"],
    );
    // Not for the shipped variants, nor a listing.
    refused(
        &["audit", "--public-param", "0"],
        &["--public-param needs --source, --cubin or --sass"],
    );
    refused(
        &["audit", "--sass", "x.sass", "--public-param", "0"],
        &["cannot be used with"],
    );
    // A cubin has no names without --signatures.
    let dir = std::env::temp_dir().join(format!("flashcore-public-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("pb.cubin");
    std::fs::write(&bin, cubin()).unwrap();
    let b = bin.to_str().unwrap();
    refused(
        &["audit", "--cubin", b, "--public-param", "block_table"],
        &["--public-param block_table", "ordinal"],
    );
    let (code, out, err) = flashcore(&[
        "audit",
        "--json",
        "--cubin",
        b,
        "--kernel",
        "pb_paged_gather",
        "--public-param",
        "block_table",
        "--signatures",
        &p,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// (l) A turn counter the kernel polls and increments by a public 1 at a public index: written,
/// but only with public values, so its reads stay public and the spin loop is clean; undeclared,
/// the loop's branch is a rule-1 finding whose chain starts at the counter's load.
#[test]
fn a_turn_counter_written_with_public_values_stays_public() {
    let k = "pb_turn_counter";
    let a = audit(k, &["turns"]);
    clean(&a);
    let b = only_buffer(&a);
    assert!(b.public_writes, "{b:#?}");
    assert_eq!(b.writes.len(), 1, "{b:#?}");
    assert!(insn_at(k, b.writes[0]).op().starts_with("RED"), "{b:#?}");
    assert_eq!(b.public_loads.len(), 1, "{b:#?}");
    assert!(b.unproven_loads.is_empty(), "{b:#?}");
    let spin = b.public_loads[0];
    let a = audit(k, &[]);
    let v = verdicts(&a);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].0, v[0].1.as_str()), (Rule::ControlFlow, "BRA"));
    assert_eq!(chain_start(&a.findings[0]), spin);
}

/// (m) The same counter incremented by a value derived from the data: declared public or not,
/// its reads are secret and the spin loop's branch is a rule-1 finding.
#[test]
fn a_turn_counter_written_with_secret_values_is_not_public() {
    let k = "pb_turn_counter_secret";
    let a = audit(k, &["turns"]);
    let b = only_buffer(&a);
    assert!(!b.public_writes, "{b:#?}");
    assert!(b.public_loads.is_empty(), "{b:#?}");
    assert_eq!(
        b.unproven_loads.len(),
        1,
        "the counter's read, demoted: {b:#?}"
    );
    let v = verdicts(&a);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].0, v[0].1.as_str()), (Rule::ControlFlow, "BRA"));
    assert_eq!(chain_start(&a.findings[0]), b.unproven_loads[0]);
}

/// (n) A tile counter: tickets from an atomic increment (the old value is a read of the buffer),
/// the counter set back to zero by the last CTA. Written only with public values at public
/// addresses, so the tickets are public and the addresses built from them are clean; undeclared,
/// the tickets are secret (the loop's branch and the tile's addresses are findings).
#[test]
fn a_tile_counter_gives_public_tickets() {
    let k = "pb_tile_counter";
    let a = audit(k, &["counter"]);
    clean(&a);
    let b = only_buffer(&a);
    assert!(b.public_writes, "{b:#?}");
    assert!(b.unproven_loads.is_empty(), "{b:#?}");
    assert_eq!(b.public_loads.len(), 2, "the two tickets: {b:#?}");
    for &i in &b.public_loads {
        assert!(insn_at(k, i).op().starts_with("ATOMG"), "{b:#?}");
    }
    assert_eq!(b.writes.len(), 4, "two increments, two resets: {b:#?}");
    let a = audit(k, &[]);
    let v = verdicts(&a);
    assert!(
        v.iter().any(|f| f.0 == Rule::ControlFlow) && v.iter().any(|f| f.0 == Rule::MemoryAddress),
        "{v:?}"
    );
}

/// (o) The same counter incremented by a value derived from the data: declared public or not,
/// its tickets are secret.
#[test]
fn a_tile_counter_written_with_secret_values_is_not_public() {
    let k = "pb_tile_counter_secret";
    let a = audit(k, &["counter"]);
    let b = only_buffer(&a);
    assert!(!b.public_writes, "{b:#?}");
    assert!(b.public_loads.is_empty(), "{b:#?}");
    assert_eq!(b.unproven_loads.len(), 1, "the ticket, demoted: {b:#?}");
    assert!(
        insn_at(k, b.unproven_loads[0]).op().starts_with("ATOMG"),
        "{b:#?}"
    );
    assert!(!verdicts(&a).is_empty());
}

/// (p) The tile counter's pointer also stored, as data, into another buffer (as an output
/// written from a shuffle may carry another lane's copy of it in the forward kernel): global
/// memory holds a value derived from the pointer, but a ticket reads only what is written through
/// the counter's pointer, so the tickets stay public and the tile's stores are no writes of it.
#[test]
fn a_pointer_stored_elsewhere_does_not_reach_the_tickets() {
    let k = "pb_tile_counter_pointer_elsewhere";
    let a = audit(k, &["counter"]);
    clean(&a);
    let b = only_buffer(&a);
    assert!(b.public_writes, "{b:#?}");
    assert!(b.unproven_loads.is_empty(), "{b:#?}");
    assert_eq!(b.public_loads.len(), 1, "the ticket: {b:#?}");
    assert!(
        insn_at(k, b.public_loads[0]).op().starts_with("ATOMG"),
        "{b:#?}"
    );
    assert_eq!(b.writes, b.public_loads, "the increment only: {b:#?}");
}

/// (q) The same pointer stored into the counter's own buffer: a ticket may be that pointer, so
/// the output stores at addresses built from the tickets may write the counter, with data: the
/// counter is not public, the ticket is demoted and the loop's exit and the tile's addresses are
/// findings.
#[test]
fn a_pointer_stored_into_the_counter_reaches_the_tickets() {
    let k = "pb_tile_counter_pointer_inside";
    let a = audit(k, &["counter"]);
    let b = only_buffer(&a);
    assert!(!b.public_writes, "{b:#?}");
    assert!(b.public_loads.is_empty(), "{b:#?}");
    assert_eq!(
        b.writes
            .iter()
            .filter(|&&i| insn_at(k, i).op() == "STG")
            .count(),
        2,
        "the pointer's store and the output's store write the counter: {b:#?}"
    );
    let ticket = b
        .unproven_loads
        .iter()
        .copied()
        .find(|&i| insn_at(k, i).op().starts_with("ATOMG"))
        .unwrap_or_else(|| panic!("the ticket, demoted: {b:#?}"));
    let v = verdicts(&a);
    assert!(
        v.iter().any(|f| f.0 == Rule::ControlFlow) && v.iter().any(|f| f.0 == Rule::MemoryAddress),
        "{v:?}"
    );
    assert!(a.findings.iter().all(|f| chain_start(f) == ticket), "{v:?}");
}
