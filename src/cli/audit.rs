//! `flashcore audit`: static data-obliviousness audit of kernel SASS (docs/design.md §5).
//!
//! Exit codes: 0 clean; 1 any finding (and, for the shipped variants, any spill or a forward
//! kernel without HGMMA); 2 usage or tool errors.

use crate::audit::{self, report, KernelAudit};
use crate::error::Error;

/// Audit the shipped kernels, a CUDA source file, or what nvcc builds.
///
/// What is secret: everything the kernel reads from global memory (whatever any pointer
/// parameter points to), and shared memory once secret data reached it; kernel parameters'
/// own values (sizes, strides, pointers), thread/block indices and constants are public unless
/// declared secret with --secret-param. This is also the default for --source and --cubin
/// without --secret-param. --public-param names pointers to public metadata (block tables,
/// sequence lengths) whose contents may drive addresses and branches.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Secret, by default: everything a kernel reads from global memory (whatever any pointer \
parameter points to, except the public buffers below) and shared memory once secret data reached it. Public unless named \
with --secret-param: parameter values (sizes, strides, pointers), thread/block indices, \
__constant__ data.

Public buffers (--public-param): what a pointer parameter, or a pointer field of a struct \
parameter (PARAM:OFFSET, the field's byte offset as offsetof gives it), points to is public \
metadata — a block table, cache_seqlens, cu_seqlens. A global load is public only when its \
address is that pointer plus public offsets on every path; an address mixing in a secret is still \
a finding and its value stays secret; a buffer the kernel writes stays public only if every write stores a public value at a public address (a turn counter). The report lists \
each public buffer with the loads proven to read it.

Exit codes: 0 clean, 1 a finding, 2 a usage or tool error.

Examples:
  flashcore audit --source my_kernel.cu
  flashcore audit --source my_kernel.cu -I include -D USE_FP16 --kernel attn --secret-param len
  flashcore audit --source decode.cu --public-param block_table --public-param cache_seqlens
  flashcore audit --source decode.cu --public-param p:0x18     (pointer field at byte 0x18 of p)
  nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -lineinfo -o k.cubin k.cu
  flashcore audit --cubin k.cubin --secret-param 3      (also a fat binary, object or executable)"
)]
pub struct AuditArgs {
    /// Compile this CUDA file with NVRTC (toolkit headers found like nvcc: $CUDA_HOME/include,
    /// /usr/local/cuda/include or the pinned PyPI wheels' include/; with line info) and audit
    /// every kernel in it.
    #[arg(long, value_name = "FILE.cu", conflicts_with = "cubin")]
    pub source: Option<std::path::PathBuf>,
    /// Audit what nvcc builds: a cubin (`nvcc -cubin`), a fat binary (`-fatbin`), an object
    /// (`-c`) or an executable with embedded cubins; build with -lineinfo to get source lines.
    #[arg(long, value_name = "FILE", conflicts_with = "sass")]
    pub cubin: Option<std::path::PathBuf>,
    /// Audit an `nvdisasm -c` listing (global memory secret; no parameter can be declared
    /// secret without the cubin's parameter layout).
    #[arg(long, value_name = "FILE.sass", conflicts_with_all = ["source", "secret_params", "public_params"])]
    pub sass: Option<std::path::PathBuf>,
    /// Add DIR to the header search path (before the toolkit's); repeatable. With --source.
    #[arg(
        short = 'I',
        long = "include-dir",
        value_name = "DIR",
        requires = "source"
    )]
    pub include_dirs: Vec<std::path::PathBuf>,
    /// Define a macro, NAME or NAME=VALUE; repeatable. With --source.
    #[arg(short = 'D', long = "define", value_name = "NAME[=VAL]", value_parser = parse_define)]
    pub defines: Vec<String>,
    /// C++ standard for --source [default: c++17].
    #[arg(long, value_name = "STD",
          value_parser = clap::builder::PossibleValuesParser::new(audit::source::STANDARDS))]
    pub std: Option<String>,
    /// SASS architecture: the target of --source (default sm_90a); with --cubin, audit only
    /// the cubin built for it when the file holds several.
    #[arg(long, value_name = "sm_XX", value_parser = parse_arch, conflicts_with = "sass")]
    pub arch: Option<String>,
    /// Audit only this kernel (its symbol, or its plain name for C++ kernels).
    #[arg(long, value_name = "NAME")]
    pub kernel: Option<String>,
    /// Treat this kernel parameter's value as secret: a 0-based ordinal, or (with --source, or
    /// --signatures) the parameter's name as written in the kernel's signature; repeatable.
    #[arg(long = "secret-param", value_name = "N|NAME")]
    pub secret_params: Vec<audit::ParamSpec>,
    /// The buffer this pointer points to is public metadata (a block table, cache_seqlens,
    /// cu_seqlens): loads proven to read it through public offsets give public values. A pointer
    /// parameter by 0-based ordinal or (with --source, or --signatures) name, or PARAM:OFFSET
    /// for the 8-byte pointer field at byte OFFSET (decimal or 0x hex, as offsetof gives it)
    /// inside a struct parameter; repeatable. A parameter may not be both secret and public.
    #[arg(long = "public-param", value_name = "N|NAME[:OFFSET]")]
    pub public_params: Vec<audit::PublicSpec>,
    /// With --cubin: read parameter names for --secret-param and --public-param from this
    /// source file.
    #[arg(long, value_name = "FILE.cu")]
    pub signatures: Option<std::path::PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn parse_define(s: &str) -> Result<String, String> {
    audit::source::check_define(s).map(|_| s.to_string())
}

fn parse_arch(s: &str) -> Result<String, String> {
    audit::source::check_arch(s).map(|_| s.to_string())
}

fn read(path: &std::path::Path) -> crate::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

fn audit_user(args: &AuditArgs) -> crate::Result<Vec<KernelAudit>> {
    let mut sel = audit::Selection {
        kernel: args.kernel.clone(),
        secret: args.secret_params.clone(),
        public: args.public_params.clone(),
        signatures: None,
    };
    if let Some(sig) = &args.signatures {
        let text = String::from_utf8_lossy(&read(sig)?).into_owned();
        sel.signatures = Some(audit::signature::parse_signatures(&text));
    }
    if let Some(src) = &args.source {
        let opts = audit::source::SourceOptions {
            include_dirs: args.include_dirs.clone(),
            defines: args.defines.clone(),
            std: args.std.clone().unwrap_or_else(|| "c++17".into()),
            arch: args
                .arch
                .clone()
                .unwrap_or_else(|| crate::jit::ARCH.to_string()),
            lineinfo: true,
        };
        audit::audit_source(src, &opts, &sel)
    } else if let Some(path) = &args.sass {
        let text = String::from_utf8_lossy(&read(path)?).into_owned();
        audit::audit_listing_selected(&text, &sel)
    } else if let Some(path) = &args.cubin {
        audit::audit_binary(path, &read(path)?, args.arch.as_deref(), &sel)
    } else {
        Err(Error::Other("nothing to audit".into()))
    }
}

/// Flags that only mean something beside another: the first one given without it.
fn misplaced(args: &AuditArgs) -> Option<String> {
    let source_only = [
        (!args.include_dirs.is_empty(), "-I/--include-dir"),
        (!args.defines.is_empty(), "-D/--define"),
        (args.std.is_some(), "--std"),
    ];
    if args.source.is_none() {
        if let Some((_, flag)) = source_only.iter().find(|(given, _)| *given) {
            return Some(format!("{flag} needs --source (it is a compile option)"));
        }
    }
    if args.signatures.is_some() && args.cubin.is_none() {
        return Some("--signatures needs --cubin (--source reads its own names)".into());
    }
    None
}

pub fn run(args: AuditArgs) -> i32 {
    if let Some(why) = misplaced(&args) {
        return super::fail(2, why);
    }
    let shipped = args.source.is_none() && args.cubin.is_none() && args.sass.is_none();
    if shipped {
        for (given, flag) in [
            (!args.secret_params.is_empty(), "--secret-param"),
            (!args.public_params.is_empty(), "--public-param"),
            (args.kernel.is_some(), "--kernel"),
            (args.arch.is_some(), "--arch"),
        ] {
            if given {
                return super::fail(
                    2,
                    format!("{flag} needs --source, --cubin or --sass (shipped variants declare their own)"),
                );
            }
        }
    }
    let result: crate::Result<Vec<KernelAudit>> = if shipped {
        crate::shipped::audit_shipped()
    } else {
        audit_user(&args)
    };
    let audits = match result {
        Ok(a) => a,
        // Missing tools, compile errors, unreadable files, bad --secret-param or --public-param:
        // usage/tool errors.
        Err(e) => return super::fail(2, e),
    };
    if audits.is_empty() {
        return super::fail(2, "no kernels found to audit");
    }
    if args.json {
        println!("{}", report::render_json(&audits));
    } else {
        print!("{}", report::render_table(&audits));
    }
    let failed = audits.iter().any(|a| {
        if shipped {
            !crate::shipped::gate_failures(a).is_empty()
        } else {
            !a.is_clean()
        }
    });
    if shipped && !args.json {
        for a in &audits {
            for why in crate::shipped::gate_failures(a) {
                eprintln!(
                    "flashcore audit: {}: {why}",
                    a.variant.as_deref().unwrap_or(&a.name)
                );
            }
        }
    }
    i32::from(failed)
}
