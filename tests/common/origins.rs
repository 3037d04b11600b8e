//! Real servers for the origin tests, each in a guard that stops it on drop: an S3 server
//! (`s3s-fs`, from crates.io) and nginx serving a directory as a static origin. Each is found by
//! its environment variable, the development cache that tools/test.sh installs into, or PATH;
//! a test without one says so and skips.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port on loopback that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The first of `$var`, `candidates` and `name` on PATH that is a file.
fn find(var: &str, candidates: &[PathBuf], name: &str) -> Option<PathBuf> {
    let from_env = std::env::var_os(var).map(PathBuf::from);
    let on_path = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    from_env
        .into_iter()
        .chain(candidates.iter().cloned())
        .chain(on_path)
        .find(|p| p.is_file())
}

/// The development cache of tools/test.sh: `$TENSORFS_DEV_CACHE`, else ~/.cache/tensorfs-dev.
fn dev_cache() -> Option<PathBuf> {
    std::env::var_os("TENSORFS_DEV_CACHE")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(std::env::var_os("HOME")?).join(".cache/tensorfs-dev")))
}

/// Waits until `port` on loopback takes connections, or panics naming `what` and its log.
fn wait_for_port(port: u16, child: &mut Child, what: &str, log: &Path) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited with {status} before listening:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "{what} did not listen on port {port} within 60 s:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// A child process killed and reaped on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An S3 server over a directory: `s3s-fs`, each bucket a folder of `root`, each object a file
/// at its key.
pub struct S3Server {
    _child: Guard,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The directory holding the buckets.
    pub root: PathBuf,
}

/// The credentials the test server takes.
const ACCESS_KEY: &str = "tensorfs-test";
const SECRET_KEY: &str = "tensorfs-test-secret";

impl S3Server {
    /// The `s3s-fs` binary: `$TENSORFS_TEST_S3S`, the dev cache's (tools/lib.sh `ensure_s3s`
    /// installs version 0.14.1 there), `/work/cache/s3s`'s, or PATH.
    pub fn binary() -> Option<PathBuf> {
        let mut candidates = Vec::new();
        if let Some(cache) = dev_cache() {
            candidates.push(cache.join("s3s-0.14.1/bin/s3s-fs"));
        }
        candidates.push(PathBuf::from("/work/cache/s3s/bin/s3s-fs"));
        find("TENSORFS_TEST_S3S", &candidates, "s3s-fs")
    }

    /// Starts `binary` over `root` (created) with bucket `bucket`, and waits until it listens.
    pub fn start(binary: &Path, root: &Path, bucket: &str) -> S3Server {
        std::fs::create_dir_all(root.join(bucket)).unwrap();
        let port = free_port();
        let log = root.with_extension("log");
        let mut child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("s3s-fs starts");
        wait_for_port(port, &mut child, "s3s-fs", &log);
        S3Server {
            _child: Guard(child),
            endpoint: format!("http://127.0.0.1:{port}"),
            root: root.to_path_buf(),
        }
    }

    /// The AWS variables that point a client at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

/// nginx serving a directory as it is: a static origin.
pub struct Nginx {
    _child: Guard,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

impl Nginx {
    /// The nginx binary: `$TENSORFS_TEST_NGINX`, `/usr/sbin/nginx`, or PATH.
    pub fn binary() -> Option<PathBuf> {
        find(
            "TENSORFS_TEST_NGINX",
            &[PathBuf::from("/usr/sbin/nginx")],
            "nginx",
        )
    }

    /// Starts `binary` in the foreground, one process, serving `root`; its configuration, logs
    /// and temp folders live in `work`.
    pub fn start(binary: &Path, root: &Path, work: &Path) -> Nginx {
        std::fs::create_dir_all(work).unwrap();
        let port = free_port();
        let w = work.display();
        let config = format!(
            "daemon off;\nmaster_process off;\nerror_log {w}/error.log warn;\npid {w}/nginx.pid;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log {w}/access.log;\n  client_body_temp_path {w}/body;\n  \
             proxy_temp_path {w}/proxy;\n  fastcgi_temp_path {w}/fastcgi;\n  \
             uwsgi_temp_path {w}/uwsgi;\n  scgi_temp_path {w}/scgi;\n  \
             default_type application/octet-stream;\n  \
             server {{\n    listen 127.0.0.1:{port};\n    root {};\n    location / {{ }}\n  }}\n}}\n",
            root.display()
        );
        let conf = work.join("nginx.conf");
        std::fs::write(&conf, config).unwrap();
        let log = work.join("error.log");
        let mut child = Command::new(binary)
            .arg("-p")
            .arg(work)
            .arg("-e")
            .arg(&log)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts");
        wait_for_port(port, &mut child, "nginx", &log);
        Nginx {
            _child: Guard(child),
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}
