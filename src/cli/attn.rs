//! `flashcore attn` (not yet implemented).

#[derive(clap::Args, Debug)]
pub struct AttnArgs {}

pub fn run(_args: AttnArgs) -> i32 {
    eprintln!("flashcore attn: not yet implemented");
    2
}
