//! `flashcore leakage` (not yet implemented).

#[derive(clap::Args, Debug)]
pub struct LeakageArgs {}

pub fn run(_args: LeakageArgs) -> i32 {
    eprintln!("flashcore leakage: not yet implemented");
    2
}
