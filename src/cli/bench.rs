//! `flashcore bench` (not yet implemented).

#[derive(clap::Args, Debug)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> i32 {
    eprintln!("flashcore bench: not yet implemented");
    2
}
