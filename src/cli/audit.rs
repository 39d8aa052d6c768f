//! `flashcore audit` (not yet implemented).

#[derive(clap::Args, Debug)]
pub struct AuditArgs {}

pub fn run(_args: AuditArgs) -> i32 {
    eprintln!("flashcore audit: not yet implemented");
    2
}
