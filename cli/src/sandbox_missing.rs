//! `up`, `sim` and `bench` in a build without the `sandbox` feature (the image's): they
//! take any arguments and say how to get a build that has them.

/// Whatever was passed; the command only explains that it is not in this build.
#[derive(clap::Args)]
pub struct Args {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
}

pub fn error(command: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "`fleetwatch {command}` is not in this build: it was built without the `sandbox` feature (the in-memory \
         Kubernetes API server), as the image is. Run it from a source checkout with `cargo run --release -- \
         {command}`, or build a binary that has it with `cargo build --release -p fleetwatch` (the default features)"
    )
}
