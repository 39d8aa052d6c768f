//! Subcommands of the `flashcore` binary, one module each. Each exposes a clap `Args` struct and
//! `run(args) -> i32` (the process exit code: 0 ok, 1 a finding or failure, 2 usage/tool error).

pub mod attn;
pub mod attn_args;
pub mod attn_grad;
pub mod attn_kv;
pub mod attn_varlen;
pub mod audit;
pub mod bench;
pub mod leakage;
pub mod perf_page;

/// Prints an error the way every subcommand does and returns exit code `code`.
pub fn fail(code: i32, e: impl std::fmt::Display) -> i32 {
    eprintln!("flashcore: error: {e}");
    code
}
