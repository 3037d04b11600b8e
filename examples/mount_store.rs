//! Mounts a store in the foreground until unmounted or SIGINT/SIGTERM: the library's mount
//! entry point without the CLI (for experiments and benchmarks).
//!
//! ```sh
//! cargo run --release --example mount_store -- STORE MOUNTPOINT [THREADS]
//! ```

use std::process::ExitCode;

use tensorfs::fuse::session::{self, MountConfig};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (store, mountpoint, threads) = match args.as_slice() {
        [store, mountpoint] => (store, mountpoint, None),
        [store, mountpoint, threads] if threads.parse::<usize>().is_ok() => {
            (store, mountpoint, threads.parse().ok())
        }
        _ => {
            eprintln!("usage: mount_store STORE MOUNTPOINT [THREADS]");
            return ExitCode::from(2);
        }
    };
    let mut config = MountConfig {
        foreground: true,
        ready_fd: session::ready_fd_from_env(),
        ..MountConfig::new(store, mountpoint)
    };
    config.threads = threads.unwrap_or(config.threads);
    match session::mount(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
