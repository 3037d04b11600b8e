//! HTTP helpers for the distribution tests: a `tensorfs serve` process in a guard, a raw
//! HTTP/1.1 request, and a static file origin (with redirects and a broken first answer on
//! demand) that records what it was asked.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A `tensorfs serve` child, killed and reaped on drop (also when a test fails).
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

impl Server {
    /// Starts `tensorfs serve <store> --listen 127.0.0.1:0 <args>` with `env`, and waits for its
    /// first line, which names the port.
    pub fn start(store: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = crate::common::tensorfs();
        command
            .arg("serve")
            .arg(store)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env("RUST_LOG", "warn");
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("tensorfs serve starts");
        let stdout = child.stdout.take().expect("piped");
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = send.send(line);
        });
        let mut server = Server {
            child,
            url: String::new(),
        };
        let line = receive
            .recv_timeout(Duration::from_secs(60))
            .expect("tensorfs serve prints where it listens within 60 s");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {line:?}"));
        server.url = url.to_owned();
        server
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port`.
    pub fn address(&self) -> &str {
        self.url.trim_start_matches("http://")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            eprintln!(
                "tensorfs serve at {} ended before the test did: {status}",
                self.url
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer: status, headers (names lowercased), body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The error envelope's code.
    pub fn code(&self) -> Option<String> {
        let value: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        Some(value["error"]["code"].as_str()?.to_owned())
    }
}

/// One HTTP/1.1 request to `address` (`host:port`), the connection closed after it.
pub fn request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = TcpStream::connect(address).expect("the server takes connections");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let has_length = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
    if (!body.is_empty() || method == "PUT" || method == "POST") && !has_length {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// How a [`StaticOrigin`] misbehaves.
#[derive(Clone, Debug, Default)]
pub struct StaticConfig {
    /// Blob requests are redirected (`302`) to this base URL.
    pub redirect_blobs_to: Option<String>,
    /// The first answer for each blob sends half its bytes and closes.
    pub break_first_answer: bool,
}

/// A static file host over a directory, like nginx or `python -m http.server`: files as they
/// are, bare `404`s, `bytes=N-` ranges. It records each request's path and whether it carried
/// `Authorization`.
pub struct StaticOrigin {
    pub url: String,
    pub seen: Arc<Mutex<Vec<(String, bool)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StaticOrigin {
    pub fn start(root: &Path, config: StaticConfig) -> StaticOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(Mutex::new(HashSet::new()));
        let (root, seen2, stop2) = (root.to_path_buf(), seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (root, seen, config, broken) =
                            (root.clone(), seen2.clone(), config.clone(), broken.clone());
                        std::thread::spawn(move || {
                            let _ = answer(stream, &root, &seen, &config, &broken);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        StaticOrigin {
            url,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The paths asked for, with whether each carried `Authorization`.
    pub fn requests(&self) -> Vec<(String, bool)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for StaticOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer(
    stream: TcpStream,
    root: &Path,
    seen: &Mutex<Vec<(String, bool)>>,
    config: &StaticConfig,
    broken: &Mutex<HashSet<String>>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((n, v)) = line.split_once(':') {
            headers.insert(n.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let path = path.split('?').next().unwrap_or("/").to_owned();
    seen.lock()
        .unwrap()
        .push((path.clone(), headers.contains_key("authorization")));
    let mut out = stream;
    let bare = |out: &mut TcpStream, status: &str| {
        write!(
            out,
            "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    let blob = path.starts_with("/blobs/");
    if let (true, Some(base)) = (blob, &config.redirect_blobs_to) {
        return write!(
            out,
            "HTTP/1.1 302 Found\r\nLocation: {base}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }
    let relative = path.trim_start_matches('/');
    if relative.split('/').any(|s| s == ".." || s.is_empty()) {
        return bare(&mut out, "404 Not Found");
    }
    let file = root.join(relative);
    let Ok(bytes) = std::fs::read(&file) else {
        return bare(&mut out, "404 Not Found");
    };
    let from = headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n < bytes.len());
    let (status, start) = match from {
        Some(n) => ("206 Partial Content", n),
        None => ("200 OK", 0),
    };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        bytes.len() - start
    );
    if from.is_some() {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{}\r\n",
            bytes.len() - 1,
            bytes.len()
        ));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if method == "HEAD" {
        return Ok(());
    }
    let body = &bytes[start..];
    if blob && config.break_first_answer && body.len() > 1 && broken.lock().unwrap().insert(path) {
        out.write_all(&body[..body.len() / 2])?;
        return out.shutdown(std::net::Shutdown::Both);
    }
    out.write_all(body)
}

/// How a [`Proxy`] misbehaves.
#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    /// After this many `PUT`s were passed on, every further `PUT` is answered `500`.
    pub fail_puts_after: Option<usize>,
    /// Every `HEAD` of a path holding `/blobs/` is answered `404` without asking the server
    /// (as if the object were stored while the client looked), so the client's `PUT`s meet
    /// objects that are there.
    pub blobs_look_absent: bool,
}

/// One request a [`Proxy`] saw: method, path, headers (names lowercased), and the status it
/// answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub status: u16,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// A forwarding HTTP/1.1 proxy in front of a server, one request per connection, that records
/// every request and fails some on demand.
pub struct Proxy {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy to `upstream` (`http://host:port`).
    pub fn start(upstream: &str, config: ProxyConfig) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let puts = Arc::new(Mutex::new(0usize));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (upstream, seen, config, puts) = (
                            upstream.clone(),
                            seen2.clone(),
                            config.clone(),
                            puts.clone(),
                        );
                        std::thread::spawn(move || {
                            let _ = forward(stream, &upstream, &seen, &config, &puts);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            url,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Every request so far, in the order they arrived.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests so far had `method` and a path starting with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|s| s.method == method && s.path.starts_with(prefix))
            .count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn forward(
    stream: TcpStream,
    upstream: &str,
    seen: &Mutex<Vec<Seen>>,
    config: &ProxyConfig,
    puts: &Mutex<usize>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let mut head = Vec::new();
    let mut headers = BTreeMap::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            if name == "content-length" {
                length = value.trim().parse().unwrap_or(0);
            }
            if name != "connection" {
                head.push(line.trim_end().to_owned());
            }
            headers.insert(name, value.trim().to_owned());
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let mut parts = first.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("/").to_owned(),
    );
    let mut out = stream;
    let canned = |status: u16| -> Option<String> {
        let body = match status {
            500 => r#"{"error":{"code":"internal","message":"injected failure"}}"#,
            _ => "",
        };
        let reason = if status == 500 {
            "Internal Server Error"
        } else {
            "Not Found"
        };
        Some(format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    };
    let answer = if method == "HEAD" && config.blobs_look_absent && path.contains("/blobs/") {
        canned(404)
    } else if method == "PUT" {
        let mut puts = puts.lock().unwrap();
        match config.fail_puts_after {
            Some(limit) if *puts >= limit => canned(500),
            _ => {
                *puts += 1;
                None
            }
        }
    } else {
        None
    };
    let response = match answer {
        Some(canned) => canned.into_bytes(),
        None => {
            let mut up = TcpStream::connect(upstream)?;
            let mut request = format!("{method} {path} HTTP/1.1\r\n");
            for line in &head {
                request.push_str(line);
                request.push_str("\r\n");
            }
            request.push_str("Connection: close\r\n\r\n");
            up.write_all(request.as_bytes())?;
            up.write_all(&body)?;
            let mut response = Vec::new();
            up.read_to_end(&mut response)?;
            response
        }
    };
    let status = String::from_utf8_lossy(&response[..response.len().min(64)])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    seen.lock().unwrap().push(Seen {
        method,
        path,
        headers,
        status,
    });
    out.write_all(&response)?;
    out.flush()
}
