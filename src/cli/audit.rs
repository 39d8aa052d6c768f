//! `flashcore audit`: static data-obliviousness audit of kernel SASS (DESIGN.md §5).
//!
//! Exit codes: 0 clean; 1 any finding (and, for the shipped variants, any spill or a forward
//! kernel without HGMMA); 2 usage or tool errors.

use crate::audit::{self, report, KernelAudit};
use crate::error::Error;

/// Audit the shipped kernels, a CUDA source file or a cubin.
#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// Compile this CUDA file with the project's NVRTC options and audit every `extern "C"`
    /// kernel in it.
    #[arg(long, value_name = "FILE.cu", conflicts_with = "cubin")]
    pub source: Option<std::path::PathBuf>,
    /// Audit every kernel of an existing cubin.
    #[arg(long, value_name = "FILE.cubin", conflicts_with = "sass")]
    pub cubin: Option<std::path::PathBuf>,
    /// Audit an `nvdisasm -c` listing (global memory secret; no parameter can be declared
    /// secret without the cubin's parameter layout).
    #[arg(long, value_name = "FILE.sass", conflicts_with_all = ["source", "secret_params"])]
    pub sass: Option<std::path::PathBuf>,
    /// Treat kernel parameter N (0-based ordinal) as secret; repeatable. Only with --source or
    /// --cubin (the shipped variants declare their own secret parameters).
    #[arg(long = "secret-param", value_name = "N")]
    pub secret_params: Vec<usize>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: AuditArgs) -> i32 {
    let shipped = args.source.is_none() && args.cubin.is_none() && args.sass.is_none();
    if shipped && !args.secret_params.is_empty() {
        return super::fail(
            2,
            "--secret-param needs --source or --cubin (shipped variants declare their own)",
        );
    }
    let result: crate::Result<Vec<KernelAudit>> = if let Some(src) = &args.source {
        audit::audit_source_file(src, &args.secret_params)
    } else if let Some(path) = &args.sass {
        std::fs::read_to_string(path)
            .map_err(|e| Error::Io {
                path: path.clone(),
                source: e,
            })
            .and_then(|text| audit::audit_listing(&text))
    } else if let Some(path) = &args.cubin {
        std::fs::read(path)
            .map_err(|e| Error::Io {
                path: path.clone(),
                source: e,
            })
            .and_then(|bytes| audit::audit_cubin(&bytes, &args.secret_params))
    } else {
        audit::audit_shipped()
    };
    let audits = match result {
        Ok(a) => a,
        // Missing tools, compile errors, unreadable files, bad --secret-param: usage/tool errors.
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
            !a.gate_failures().is_empty()
        } else {
            !a.is_clean()
        }
    });
    if shipped && !args.json {
        for a in &audits {
            for why in a.gate_failures() {
                eprintln!(
                    "flashcore audit: {}: {why}",
                    a.variant.as_deref().unwrap_or(&a.name)
                );
            }
        }
    }
    i32::from(failed)
}
