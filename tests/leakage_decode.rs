//! Decode mode of the leakage test, GPU-free: what `flashcore leakage --decode`
//! configures, every combination it refuses (the library's own checks included: no cycle timer,
//! no floor, no control in decode mode), the paged cache's block table, and the JSON record of
//! the call. The process-level usage errors are in `tests/leakage_cli.rs`, the GPU run in
//! `tests/leakage_gpu.rs`.

use clap::Parser;
use flashcore::attention::{AttentionParams, DType, Layout};
use flashcore::cli::leakage::{config, LeakageArgs};
use flashcore::kernels::LeakyControl;
use flashcore::leakage::decode::block_table;
use flashcore::leakage::report::{DecodeRun, EnvInfo, LeakageFile, RunInfo, SCHEMA_VERSION};
use flashcore::leakage::{DecodeConfig, FixedClass, LeakageConfig, LengthClass};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    a: LeakageArgs,
}

fn parse(args: &[&str]) -> Result<(LeakageConfig, Vec<FixedClass>), String> {
    let cli = Cli::try_parse_from(std::iter::once("leakage").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    config(&cli.a)
}

fn cfg_of(args: &[&str]) -> LeakageConfig {
    parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}")).0
}

fn refused(args: &[&str], says: &str) {
    match parse(args) {
        Ok(_) => panic!("{args:?} accepted"),
        Err(e) => assert!(e.contains(says), "{args:?}: expected `{says}` in: {e}"),
    }
}

/// The defaults of `--decode --secret-len` need no other flag: secret counts, contiguous cache,
/// one new query, Hkv = Hq, --seqlen the capacity, the four length classes, and neither the
/// cycle timer nor the floor.
#[test]
fn decode_defaults_need_no_other_flag() {
    let (c, classes) = parse(&["--decode", "--secret-len"]).unwrap();
    assert_eq!(c.decode, Some(DecodeConfig::secret()));
    assert!(c.secret_len && !c.cycles && !c.floor && c.control.is_none() && !c.floor_kernel);
    let p = &c.params;
    assert_eq!(
        (p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv),
        (1, 512, 8, 8)
    );
    assert_eq!(
        classes,
        LengthClass::ALL.map(FixedClass::Length).to_vec(),
        "the length classes, in order"
    );
    // --no-cycles / --no-floor are accepted (and change nothing).
    let c2 = cfg_of(&["--decode", "--secret-len", "--no-cycles", "--no-floor"]);
    assert_eq!(c2.decode, c.decode);
    assert!(!c2.cycles && !c2.floor);
}

#[test]
fn decode_shape_counts_and_pages_from_the_flags() {
    let c = cfg_of(&[
        "--decode",
        "--secret-len",
        "--batch",
        "4",
        "--heads",
        "32",
        "--kv-heads",
        "8",
        "--seqlen",
        "4096",
        "--seqlen-q",
        "4",
        "--headdim",
        "128",
        "--dtype",
        "bf16",
        "--causal",
        "--class",
        "len-half",
    ]);
    let p = &c.params;
    assert_eq!(
        (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim),
        (4, 32, 8, 4, 4096, 128)
    );
    assert!(p.causal && p.dtype == DType::Bf16);
    let (_, classes) = parse(&["--decode", "--secret-len", "--class", "len-half"]).unwrap();
    assert_eq!(classes, vec![FixedClass::Length(LengthClass::Half)]);

    let public = cfg_of(&["--decode", "--secret-len", "--public-counts"]);
    let d = public.decode.unwrap();
    assert!(!d.secret_counts && d.page_size.is_none());

    let paged = cfg_of(&["--decode", "--secret-len", "--page-size", "64"]);
    let d = paged.decode.unwrap();
    assert_eq!(d.page_size, Some(64));
    assert!(
        d.secret_counts && d.shuffled_pages,
        "pages shuffled by default"
    );
    let pg = d.pages(&paged.params).unwrap();
    assert_eq!((pg.page_size, pg.num_pages), (64, 8));
    assert_eq!(pg.pool_len(&paged.params), paged.params.kv_len());
    assert!(d.describe().contains("paged 64 (shuffled)"));

    let ordered = cfg_of(&[
        "--decode",
        "--secret-len",
        "--page-size",
        "16",
        "--page-order",
        "identity",
    ]);
    assert!(!ordered.decode.unwrap().shuffled_pages);
    let shuffled = cfg_of(&[
        "--decode",
        "--secret-len",
        "--page-size",
        "16",
        "--page-order",
        "shuffled",
    ]);
    assert!(shuffled.decode.unwrap().shuffled_pages);
}

#[test]
fn decode_only_flags_need_decode() {
    for args in [
        &["--seqlen-q", "1"][..],
        &["--kv-heads", "2"][..],
        &["--public-counts"][..],
        &["--page-size", "64"][..],
        &["--page-order", "identity"][..],
        &["--secret-len", "--seqlen-q", "4"][..],
    ] {
        refused(args, "belongs to decode mode: add --decode --secret-len");
    }
    refused(
        &["--decode", "--secret-len", "--page-order", "identity"],
        "add --page-size",
    );
}

#[test]
fn decode_refuses_what_does_not_apply() {
    refused(&["--decode"], "add --secret-len");
    refused(&["--decode", "--public-counts"], "add --secret-len");
    for control in ["early-exit", "skip-past-length", "floor"] {
        refused(
            &["--decode", "--secret-len", "--control", control],
            "--public-counts",
        );
    }
    refused(
        &["--decode", "--secret-len", "--class", "zeros"],
        "decode mode",
    );
    refused(
        &["--decode", "--secret-len", "--class", "len-2"],
        "len-half",
    );
}

#[test]
fn decode_shape_errors_before_any_device() {
    refused(
        &["--decode", "--secret-len", "--seqlen-q", "17"],
        "at most 16",
    );
    refused(&["--decode", "--secret-len", "--seqlen-q", "0"], "seqlen_q");
    refused(&["--decode", "--secret-len", "--kv-heads", "3"], "heads_kv");
    refused(&["--decode", "--secret-len", "--kv-heads", "0"], "heads_kv");
    refused(&["--decode", "--secret-len", "--headdim", "80"], "head_dim");
    // Any page size of at least one row that divides the capacity (512 by default).
    refused(
        &["--decode", "--secret-len", "--page-size", "24"],
        "512 is not a multiple of 24",
    );
    refused(
        &["--decode", "--secret-len", "--page-size", "0"],
        "at least 1 row",
    );
    for page in ["1", "8", "128"] {
        let c = cfg_of(&["--decode", "--secret-len", "--page-size", page]);
        assert_eq!(
            c.decode.as_ref().and_then(|d| d.page_size),
            page.parse().ok()
        );
    }
    refused(
        &[
            "--decode",
            "--secret-len",
            "--seqlen",
            "500",
            "--page-size",
            "64",
        ],
        "not a multiple of 64",
    );
    refused(
        &[
            "--decode",
            "--secret-len",
            "--page-size",
            "64",
            "--layout",
            "bhsd",
        ],
        "bshd",
    );
    // A capacity that is no multiple of a tile, an Sq ≠ Sk: fine in decode mode.
    let c = cfg_of(&[
        "--decode",
        "--secret-len",
        "--seqlen",
        "1000",
        "--seqlen-q",
        "3",
    ]);
    assert_eq!((c.params.seqlen_q, c.params.seqlen_k), (3, 1000));
}

/// The library refuses decode mode with the builds it cannot time, whoever builds the config.
#[test]
fn library_refuses_cycles_floor_and_controls_in_decode_mode() {
    let mut params = AttentionParams::new(2, 8, 1024, 64);
    params.seqlen_q = 1;
    params.heads_kv = 2;
    let ok = || {
        let mut c = LeakageConfig::new(params.clone());
        c.secret_len = true;
        c.decode = Some(DecodeConfig::secret());
        c.cycles = false;
        c.floor = false;
        c
    };
    assert_eq!(ok().validate(), Ok(()));

    let mut c = ok();
    c.cycles = true;
    let e = c.validate().unwrap_err();
    assert!(
        e.contains("no cycle timer in decode mode") && e.contains("--no-cycles"),
        "{e}"
    );
    let mut c = ok();
    c.floor = true;
    let e = c.validate().unwrap_err();
    assert!(
        e.contains("no floor in decode mode") && e.contains("--no-floor"),
        "{e}"
    );
    let mut c = ok();
    c.control = Some(LeakyControl::SkipPastSecretLength);
    assert!(c.validate().unwrap_err().contains("--public-counts"));
    let mut c = ok();
    c.floor_kernel = true;
    assert!(c.validate().unwrap_err().contains("--public-counts"));
    let mut c = ok();
    c.secret_len = false;
    assert!(c.validate().unwrap_err().contains("--secret-len"));
    let mut c = ok();
    c.decode = Some(DecodeConfig {
        shuffled_pages: true,
        ..DecodeConfig::secret()
    });
    assert!(c.validate().unwrap_err().contains("--page-size"));
    // Decode mode does not need Sq = Sk (secret-length prefill does).
    let mut c = ok();
    c.decode = None;
    assert!(c.validate().is_err(), "prefill secret-length needs Sq = Sk");
    // The shared checks still apply.
    let mut c = ok();
    c.measurements = 10;
    assert!(c.validate().unwrap_err().contains("--measurements"));
    let mut c = ok();
    c.params.layout = Layout::Bhsd;
    c.decode = Some(DecodeConfig {
        page_size: Some(64),
        ..DecodeConfig::secret()
    });
    assert!(c.validate().unwrap_err().contains("bshd"));
}

#[test]
fn block_tables_use_every_page_once() {
    let identity = block_table(4, 64, false, 7);
    assert_eq!(identity, (0..256).collect::<Vec<i32>>());
    let shuffled = block_table(4, 64, true, 7);
    assert_ne!(shuffled, identity, "shuffled");
    let mut sorted = shuffled.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, identity, "a permutation of the pool");
    assert_eq!(block_table(4, 64, true, 7), shuffled, "fixed by the seed");
    assert_ne!(block_table(4, 64, true, 8), shuffled);
    assert_eq!(block_table(1, 1, true, 7), vec![0]);
}

/// Version 4: decode mode's call is recorded under `run.decode` and read back; other modes'
/// files have no `decode` (and version-3 files still read).
#[test]
fn json_records_the_decode_call() {
    let run = |decode: Option<DecodeRun>| RunInfo {
        batch: 4,
        heads: 32,
        seqlen: 4096,
        head_dim: 128,
        dtype: "bf16".into(),
        layout: "bshd".into(),
        causal: false,
        secret_len: true,
        kernel: "shipped".into(),
        measurements_requested: 20_000,
        budget_s: None,
        pool: 16,
        seed: 1,
        queue_us: 20.0,
        cycles: false,
        floor: false,
        floor_cycles: false,
        decode,
    };
    let d = DecodeRun {
        seqlen_q: 1,
        heads_kv: 8,
        config: DecodeConfig {
            secret_counts: true,
            page_size: Some(64),
            shuffled_pages: true,
        },
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decode.json");
    LeakageFile::new(run(Some(d)), EnvInfo::default(), vec![])
        .write(&path)
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["version"], SCHEMA_VERSION);
    let j = &v["run"]["decode"];
    assert_eq!(j["seqlen_q"], 1);
    assert_eq!(j["heads_kv"], 8);
    assert_eq!(j["secret_counts"], true);
    assert_eq!(j["page_size"], 64);
    assert_eq!(j["shuffled_pages"], true);
    let back: LeakageFile = serde_json::from_str(&text).unwrap();
    assert_eq!(back.run.decode, Some(d));

    // Prefill runs: no `decode` key; a version-3 file (none) reads as prefill.
    let prefill =
        serde_json::to_value(LeakageFile::new(run(None), EnvInfo::default(), vec![])).unwrap();
    assert!(prefill["run"].get("decode").is_none());
    let mut old = prefill.clone();
    old["version"] = 3.into();
    let back: LeakageFile = serde_json::from_value(old).unwrap();
    assert!(back.run.decode.is_none());
}
