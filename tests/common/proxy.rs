//! A fault-injecting HTTP proxy for the distribution tests: it stands in front of a
//! `tensorfs serve`, forwards every request, and answers the requests a rule matches with a
//! fault instead (a dropped connection mid-body, a status, a delay, a stalled body, a wrong
//! byte, a truncated body, a redirect loop). It records each request and the body bytes it
//! sent, so a test can count what a client fetched.
#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// What the proxy does instead of forwarding.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answers this status with an error envelope, without asking the server.
    Status(u16),
    /// Waits this long, then forwards.
    Delay(Duration),
    /// Forwards the head and this many body bytes, then drops the connection.
    DropAfter(u64),
    /// Forwards this many body bytes, then waits this long before the rest.
    Stall(u64, Duration),
    /// Forwards with the body byte at this offset changed (same length).
    WrongByte(u64),
    /// Forwards this many body bytes as if they were the whole answer (`Content-Length` says
    /// so), and ends.
    Truncate(u64),
    /// Redirects to the same URL, forever.
    RedirectLoop,
}

/// A fault for requests whose path contains `path`, for the next `times` of them (`None`:
/// all).
#[derive(Clone, Debug)]
pub struct Rule {
    pub path: String,
    pub fault: Fault,
    pub times: Option<usize>,
}

impl Rule {
    /// `fault` for every request whose path contains `path`.
    pub fn always(path: &str, fault: Fault) -> Rule {
        Rule {
            path: path.to_owned(),
            fault,
            times: None,
        }
    }

    /// `fault` for the next `times` requests whose path contains `path`.
    pub fn times(path: &str, fault: Fault, times: usize) -> Rule {
        Rule {
            path: path.to_owned(),
            fault,
            times: Some(times),
        }
    }
}

/// A request the proxy answered.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// The status sent.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// The fault applied, if any.
    pub fault: Option<String>,
}

#[derive(Default)]
struct State {
    rules: Mutex<Vec<Rule>>,
    seen: Mutex<Vec<Arc<Mutex<Seen>>>>,
}

/// The proxy; dropping it stops it.
pub struct Proxy {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Proxy {
    /// A proxy in front of `upstream` (`http://host:port`).
    pub fn start(upstream: &str) -> Proxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State::default());
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let upstream = upstream.trim_end_matches('/').to_owned();
        let accepting = state.clone();
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, client, upstream) =
                    (accepting.clone(), client.clone(), upstream.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (state, client, upstream) =
                            (state.clone(), client.clone(), upstream.clone());
                        async move {
                            Ok::<_, Infallible>(answer(&state, &client, &upstream, request).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Proxy {
            url,
            state,
            runtime: Some(runtime),
        }
    }

    /// Adds a rule; earlier rules are tried first.
    pub fn add(&self, rule: Rule) {
        self.state.rules.lock().unwrap().push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.state.rules.lock().unwrap().clear();
    }

    /// Every request answered so far.
    pub fn seen(&self) -> Vec<Seen> {
        let seen = self.state.seen.lock().unwrap();
        seen.iter().map(|s| s.lock().unwrap().clone()).collect()
    }

    /// Forgets the requests seen.
    pub fn forget(&self) {
        self.state.seen.lock().unwrap().clear();
    }

    /// Body bytes sent for paths under `/blobs/`.
    pub fn blob_bytes(&self) -> u64 {
        self.seen()
            .iter()
            .filter(|s| s.path.starts_with("/blobs/"))
            .map(|s| s.bytes)
            .sum()
    }

    /// GETs of paths containing `path`.
    pub fn gets(&self, path: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path.contains(path))
            .count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(status: u16, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(
        Full::new(bytes.into())
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
}

/// The first rule matching `path`, used up by one.
fn take_fault(state: &State, path: &str) -> Option<Fault> {
    let mut rules = state.rules.lock().unwrap();
    let at = rules.iter().position(|r| path.contains(&r.path))?;
    let fault = rules[at].fault.clone();
    if let Some(times) = &mut rules[at].times {
        *times -= 1;
        if *times == 0 {
            rules.remove(at);
        }
    }
    Some(fault)
}

async fn answer(
    state: &State,
    client: &reqwest::Client,
    upstream: &str,
    request: Request<Incoming>,
) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let fault = take_fault(state, &path);
    let seen = Arc::new(Mutex::new(Seen {
        method: request.method().to_string(),
        path: path.clone(),
        status: 0,
        bytes: 0,
        fault: fault.as_ref().map(|f| format!("{f:?}")),
    }));
    state.seen.lock().unwrap().push(seen.clone());
    let respond = |response: Response<Body>| {
        seen.lock().unwrap().status = response.status().as_u16();
        response
    };
    match &fault {
        Some(Fault::Status(status)) => {
            let body = format!(
                r#"{{"error":{{"code":"injected","message":"a {status} from the test proxy"}}}}"#
            );
            return respond(full(*status, body));
        }
        Some(Fault::RedirectLoop) => {
            let mut response = full(302, Bytes::new());
            let target = request
                .uri()
                .path_and_query()
                .map_or(path.clone(), |p| p.to_string());
            response
                .headers_mut()
                .insert(hyper::header::LOCATION, target.parse().unwrap());
            return respond(response);
        }
        Some(Fault::Delay(wait)) => tokio::time::sleep(*wait).await,
        _ => {}
    }
    let target = format!(
        "{upstream}{}",
        request.uri().path_and_query().map_or("/", |p| p.as_str())
    );
    let mut forward = client.request(request.method().clone(), &target);
    for name in [
        hyper::header::RANGE,
        hyper::header::AUTHORIZATION,
        hyper::header::IF_RANGE,
        hyper::header::IF_NONE_MATCH,
    ] {
        if let Some(value) = request.headers().get(&name) {
            forward = forward.header(name.as_str(), value.as_bytes());
        }
    }
    let mut upstream_answer = match forward.send().await {
        Ok(answer) => answer,
        Err(e) => {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                why.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            return respond(full(502, format!("the proxy could not forward: {why}")));
        }
    };
    let status = upstream_answer.status().as_u16();
    let length = upstream_answer.content_length();
    let (mut sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
    let mut response = Response::new(body.boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    for (name, value) in upstream_answer.headers() {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_str().as_bytes()),
            hyper::header::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    if let (Some(Fault::Truncate(n)), Some(length)) = (&fault, length) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, (*n).min(length).into());
    }
    let counted = seen.clone();
    tokio::spawn(async move {
        let mut at = 0u64;
        while let Ok(Some(chunk)) = upstream_answer.chunk().await {
            let mut bytes = chunk.to_vec();
            let end = at + bytes.len() as u64;
            match &fault {
                Some(Fault::WrongByte(offset)) if (at..end).contains(offset) => {
                    bytes[(offset - at) as usize] ^= 0x5a;
                }
                Some(Fault::DropAfter(n) | Fault::Truncate(n)) if end > *n => {
                    bytes.truncate(n.saturating_sub(at) as usize);
                }
                _ => {}
            }
            let stall = match &fault {
                Some(Fault::Stall(n, wait)) if (at..end).contains(n) => Some((*n, *wait)),
                _ => None,
            };
            let pieces: Vec<Vec<u8>> = match stall {
                Some((n, _)) => {
                    let rest = bytes.split_off((n - at) as usize);
                    vec![bytes, rest]
                }
                None => vec![bytes],
            };
            for (i, piece) in pieces.into_iter().enumerate() {
                if i == 1 {
                    tokio::time::sleep(stall.unwrap().1).await;
                }
                let sent = piece.len() as u64;
                if sent > 0 && sender.send_data(Bytes::from(piece)).await.is_err() {
                    return;
                }
                counted.lock().unwrap().bytes += sent;
            }
            at = end;
            match &fault {
                Some(Fault::DropAfter(n)) if at >= *n => {
                    sender.abort(std::io::Error::other("dropped by the test proxy"));
                    return;
                }
                Some(Fault::Truncate(n)) if at >= *n => return,
                _ => {}
            }
        }
    });
    respond(response)
}
