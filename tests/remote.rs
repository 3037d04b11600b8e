//! distribution/1 end to end: `tensorfs serve` over an imported store, `tensorfs download` into
//! another, the blob routes' statuses, uploads, tokens, a static origin, and the reference's
//! `tfs conform endpoint` against our server.

mod common;
#[path = "common/http.rs"]
mod http;
mod skip;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use http::{request, Server, StaticConfig, StaticOrigin};
use tensorfs::format::{ObjectRef, Release, Repo};
use tensorfs::store::Store;

/// A store with a Transformers folder imported as `local/tiny` and its commit published as
/// release 1.0 of `acme/tiny`. Returns the store and the commit.
fn published_store(dir: &Path) -> (PathBuf, ObjectRef) {
    let folder = dir.join("folder");
    transformers_folder(&folder);
    let root = dir.join("origin");
    ok(
        &root,
        &["import", folder.to_str().unwrap(), "--name", "local/tiny"],
    );
    let store = Store::open_existing(&root).unwrap();
    let commit = store.repo("local/tiny").unwrap().unwrap().commits[0];
    let lane = store
        .tree(&commit)
        .unwrap()
        .lane
        .expect("imports name a lane");
    publish(&store, "acme/tiny", Some(("1.0", &lane)), commit);
    (root, commit)
}

/// Names `commit` in repo `name`: as a release's lane, or among its unreleased commits.
fn publish(store: &Store, name: &str, release: Option<(&str, &str)>, commit: ObjectRef) {
    store
        .update_repo(name, |old| {
            let mut repo = old.unwrap_or(Repo {
                name: name.into(),
                releases: vec![],
                commits: vec![],
            });
            match release {
                Some((version, lane)) => repo.releases.push(Release {
                    version: version.into(),
                    lanes: BTreeMap::from([(lane.into(), commit)]),
                }),
                None => repo.commits.push(commit),
            }
            repo
        })
        .unwrap();
}

/// Every blob of a store, path → bytes.
fn blobs(root: &Path) -> BTreeMap<String, Vec<u8>> {
    files_of(&root.join("blobs"))
}

fn blob_path(object: &ObjectRef) -> String {
    format!("/{}", object.blob_path())
}

fn download(store: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    tensorfs()
        .arg("--store")
        .arg(store)
        .arg("download")
        .args(args)
        .env_remove("TENSORFS_ENDPOINT")
        .env_remove("TENSORFS_TOKEN")
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

fn succeeded(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "download failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn exported(store: &Path, reference: &str, dir: &Path) -> BTreeMap<String, Vec<u8>> {
    ok(store, &["export", reference, dir.to_str().unwrap()]);
    files_of(dir)
}

#[test]
fn a_downloaded_release_is_the_same_repo_objects_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commit) = published_store(dir.path());
    let server = Server::start(&origin, &[], &[]);
    let local = dir.path().join("local");
    let out = download(&local, &["acme/tiny@1.0", "--endpoint", &server.url], &[]);
    let said = succeeded(&out);
    assert!(said.contains(&commit.id()), "{said}");

    assert_eq!(
        fs::read(local.join("refs/acme/tiny.json")).unwrap(),
        fs::read(origin.join("refs/acme/tiny.json")).unwrap(),
        "the repo document names the same release"
    );
    assert_eq!(
        blobs(&local),
        blobs(&origin),
        "the same objects, byte for byte"
    );
    let a = exported(&origin, "acme/tiny@1.0", &dir.path().join("a"));
    let b = exported(&local, "acme/tiny@1.0", &dir.path().join("b"));
    assert!(a.contains_key("model.safetensors"), "{:?}", a.keys());
    assert_eq!(a, b);
    ok(&local, &["verify"]);

    // Again, by TENSORFS_ENDPOINT and without a release: nothing is left to fetch.
    let out = download(
        &local,
        &["acme/tiny"],
        &[("TENSORFS_ENDPOINT", &server.url)],
    );
    let said = succeeded(&out);
    assert!(said.contains(" 0 of "), "{said}");
}

#[test]
fn blob_routes_answer_heads_ranges_and_unknown_objects() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commit) = published_store(dir.path());
    let server = Server::start(&origin, &[], &[]);
    let at = server.address();
    let tree = fs::read(origin.join(commit.blob_path())).unwrap();
    let path = blob_path(&commit);
    let etag = format!("\"{}\"", commit.sha256);

    let head = request(at, "HEAD", &path, &[], b"");
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        Some(&*tree.len().to_string())
    );
    assert_eq!(head.header("etag"), Some(&*etag));
    assert!(head.body.is_empty());

    let whole = request(at, "GET", &path, &[], b"");
    assert_eq!((whole.status, &whole.body), (200, &tree));

    let part = request(at, "GET", &path, &[("Range", "bytes=2-9")], b"");
    assert_eq!(part.status, 206);
    assert_eq!(part.body, tree[2..10]);
    assert_eq!(part.header("content-length"), Some("8"));
    let range = format!("bytes 2-9/{}", tree.len());
    assert_eq!(part.header("content-range"), Some(&*range));

    let tail = request(at, "GET", &path, &[("Range", "bytes=-3")], b"");
    assert_eq!(
        (tail.status, &tail.body[..]),
        (206, &tree[tree.len() - 3..])
    );

    let past = format!("bytes={}-", tree.len());
    let beyond = request(at, "GET", &path, &[("Range", &past)], b"");
    assert_eq!(beyond.status, 416);
    let star = format!("bytes */{}", tree.len());
    assert_eq!(beyond.header("content-range"), Some(&*star));

    // An If-Range naming another version gets the whole object.
    let stale = request(
        at,
        "GET",
        &path,
        &[("Range", "bytes=0-0"), ("If-Range", "\"other\"")],
        b"",
    );
    assert_eq!((stale.status, stale.body.len()), (200, tree.len()));
    let cached = request(at, "GET", &path, &[("If-None-Match", &etag)], b"");
    assert_eq!(cached.status, 304);

    let unknown = ObjectRef::of(b"nobody stored this");
    let absent = request(at, "GET", &blob_path(&unknown), &[], b"");
    assert_eq!(absent.status, 404);
    assert_eq!(absent.code().as_deref(), Some("not_found"));
    assert_eq!(
        request(at, "HEAD", &blob_path(&unknown), &[], b"").status,
        404
    );
    let misplaced = path.replacen("/blobs/", "/blobs/00", 1);
    assert_eq!(request(at, "GET", &misplaced, &[], b"").status, 404);

    // A read-only server takes no uploads.
    let put = request(at, "PUT", &path, &[], &tree);
    assert_eq!(put.status, 405);
    assert_eq!(put.code().as_deref(), Some("unsupported"));

    // The model routes: local repos are never served.
    let resolved = request(at, "GET", "/v1/models/acme/tiny/resolve", &[], b"");
    assert_eq!(resolved.status, 200);
    let json: serde_json::Value = serde_json::from_slice(&resolved.body).unwrap();
    assert_eq!(json["release"], "1.0");
    assert_eq!(json["commit"]["sha256"], commit.sha256.hex());
    assert_eq!(
        request(at, "GET", "/v1/models/local/tiny/resolve", &[], b"").status,
        404
    );
    assert_eq!(
        request(at, "GET", "/refs/local/tiny.json", &[], b"").status,
        404
    );
    let document = request(at, "GET", "/refs/acme/tiny.json", &[], b"");
    assert_eq!(
        document.body,
        fs::read(origin.join("refs/acme/tiny.json")).unwrap()
    );
}

/// The three headers of an upload of `bytes` claimed as `object`.
fn upload_headers(object: &ObjectRef) -> Vec<(&'static str, String)> {
    use base64::Engine as _;
    vec![
        (
            "x-amz-checksum-sha256",
            base64::engine::general_purpose::STANDARD.encode(object.sha256.0),
        ),
        ("If-None-Match", "*".into()),
        ("Content-Length", object.length.to_string()),
    ]
}

fn put(at: &str, object: &ObjectRef, bytes: &[u8], token: Option<&str>) -> http::Answer {
    let mut headers = upload_headers(object);
    if let Some(token) = token {
        headers.push(("Authorization", format!("Bearer {token}")));
    }
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    request(at, "PUT", &blob_path(object), &headers, bytes)
}

#[test]
fn uploads_are_admitted_only_whole_and_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commit) = published_store(dir.path());
    let token = "t0ken-for-uploads";
    let server = Server::start(
        &origin,
        &["--write", "--token-env", "TFS_TEST_TOKEN"],
        &[("TFS_TEST_TOKEN", token)],
    );
    let at = server.address();
    let fresh = b"a new object".to_vec();
    let object = ObjectRef::of(&fresh);

    let anonymous = put(at, &object, &fresh, None);
    assert_eq!(anonymous.status, 401);
    assert!(anonymous
        .header("www-authenticate")
        .is_some_and(|v| v.starts_with("Bearer")));
    assert_eq!(anonymous.code().as_deref(), Some("unauthorized"));
    assert_eq!(put(at, &object, &fresh, Some("wrong")).status, 401);
    let body = format!(
        r#"{{"commit":{{"sha256":"{}","length":{}}}}}"#,
        commit.sha256, commit.length
    );
    let post = request(
        at,
        "POST",
        "/v1/models/acme/tiny/commits",
        &[],
        body.as_bytes(),
    );
    assert_eq!(post.status, 401);

    // Present: 412, which a client takes as success.
    let tree = fs::read(origin.join(commit.blob_path())).unwrap();
    assert_eq!(put(at, &commit, &tree, Some(token)).status, 412);

    // Bytes that are not the digest the URL names are refused and leave nothing.
    let wrong = vec![b'x'; fresh.len()];
    let refused = put(at, &object, &wrong, Some(token));
    assert_eq!(refused.status, 400);
    assert_eq!(refused.code().as_deref(), Some("digest_mismatch"));
    assert_eq!(
        request(at, "HEAD", &blob_path(&object), &[], b"").status,
        404
    );
    // A checksum header naming another digest than the URL.
    let mut headers = upload_headers(&ObjectRef::of(b"other"));
    headers[2].1 = fresh.len().to_string();
    let auth = format!("Bearer {token}");
    headers.push(("Authorization", auth.clone()));
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let mismatch = request(at, "PUT", &blob_path(&object), &headers, &fresh);
    assert_eq!(mismatch.code().as_deref(), Some("digest_mismatch"));
    let tmp = temp_files(&origin);
    assert!(
        tmp.is_empty(),
        "refused uploads leave no temp files: {tmp:?}"
    );

    // The right bytes: admitted, then present.
    assert_eq!(put(at, &object, &fresh, Some(token)).status, 201);
    assert_eq!(fs::read(origin.join(object.blob_path())).unwrap(), fresh);
    let head = request(
        at,
        "HEAD",
        &blob_path(&object),
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(head.status, 200);
    assert_eq!(put(at, &object, &fresh, Some(token)).status, 412);

    // Recording a commit: known to the repo already (200), then new to another (201).
    let with = [("Authorization", auth.as_str())];
    let again = request(
        at,
        "POST",
        "/v1/models/acme/tiny/commits",
        &with,
        body.as_bytes(),
    );
    assert_eq!(again.status, 200);
    let new = request(
        at,
        "POST",
        "/v1/models/acme/fork/commits",
        &with,
        body.as_bytes(),
    );
    assert_eq!(new.status, 201);
    let store = Store::open_existing(&origin).unwrap();
    assert_eq!(store.repo("acme/fork").unwrap().unwrap().commits, [commit]);
    // A commit whose closure is not here.
    let cited = ObjectRef::of(b"a header nobody sent");
    let missing = format!(
        r#"{{"commit":{{"sha256":"{}","length":{}}}}}"#,
        cited.sha256, cited.length
    );
    let refused = request(
        at,
        "POST",
        "/v1/models/acme/fork/commits",
        &with,
        missing.as_bytes(),
    );
    assert_eq!(refused.status, 409);
    assert_eq!(refused.code().as_deref(), Some("closure_incomplete"));
    assert!(String::from_utf8_lossy(&refused.body).contains(&cited.sha256.hex()));
}

#[test]
fn a_token_keeps_unreleased_commits_private() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = published_store(dir.path());
    // A second commit, named only among acme/draft's unreleased commits.
    let draft = dir.path().join("draft");
    transformers_folder(&draft);
    fs::write(draft.join("README.md"), b"# draft\n").unwrap();
    ok(
        &origin,
        &["import", draft.to_str().unwrap(), "--name", "local/draft"],
    );
    let store = Store::open_existing(&origin).unwrap();
    let private = *store
        .repo("local/draft")
        .unwrap()
        .unwrap()
        .commits
        .last()
        .unwrap();
    publish(&store, "acme/draft", None, private);

    let token = "members-only";
    let server = Server::start(
        &origin,
        &["--token-env", "TFS_TEST_TOKEN"],
        &[("TFS_TEST_TOKEN", token)],
    );
    let at = server.address();
    let auth = format!("Bearer {token}");
    let member = [("Authorization", auth.as_str())];
    let tree = blob_path(&private);
    for path in [
        tree.as_str(),
        "/v1/models/acme/draft/resolve",
        "/refs/acme/draft.json",
    ] {
        assert_eq!(request(at, "GET", path, &[], b"").status, 404, "{path}");
        assert_eq!(request(at, "GET", path, &member, b"").status, 200, "{path}");
        let wrong = [("Authorization", "Bearer nope")];
        assert_eq!(request(at, "GET", path, &wrong, b"").status, 401, "{path}");
    }
    // What a release names stays public.
    assert_eq!(
        request(at, "GET", "/v1/models/acme/tiny/resolve", &[], b"").status,
        200
    );

    let local = dir.path().join("local");
    let denied = download(&local, &["acme/draft", "--endpoint", &server.url], &[]);
    assert!(!denied.status.success());
    let said = String::from_utf8_lossy(&denied.stderr);
    assert!(said.contains("not found"), "{said}");
    let out = download(
        &local,
        &["acme/draft", "--endpoint", &server.url],
        &[("TENSORFS_TOKEN", token)],
    );
    succeeded(&out);
    let repo = Store::open_existing(&local)
        .unwrap()
        .repo("acme/draft")
        .unwrap()
        .unwrap();
    assert_eq!((repo.releases.len(), repo.commits), (0, vec![private]));
}

#[test]
fn plain_http_off_loopback_is_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    let out = download(
        &local,
        &["acme/tiny", "--endpoint", "http://192.0.2.1:9"],
        &[],
    );
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("only on loopback"), "{said}");
    let out = download(
        &local,
        &["local/tiny", "--endpoint", "http://127.0.0.1:9"],
        &[],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("`local`"));
}

#[test]
fn a_static_origin_is_resolved_by_its_repo_document_and_broken_bodies_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commit) = published_store(dir.path());
    // Blobs come from a second origin, whose first answer for each breaks off halfway.
    let mirror = StaticOrigin::start(
        &origin,
        StaticConfig {
            break_first_answer: true,
            ..StaticConfig::default()
        },
    );
    let front = StaticOrigin::start(
        &origin,
        StaticConfig {
            redirect_blobs_to: Some(mirror.url.clone()),
            ..StaticConfig::default()
        },
    );
    let local = dir.path().join("local");
    let out = download(
        &local,
        &["acme/tiny", "--endpoint", &front.url, "--token", "secret"],
        &[],
    );
    succeeded(&out);
    assert_eq!(blobs(&local), blobs(&origin));
    let repo = Store::open_existing(&local)
        .unwrap()
        .repo("acme/tiny")
        .unwrap()
        .unwrap();
    assert_eq!(repo.releases[0].lanes.values().next(), Some(&commit));

    let front_seen = front.requests();
    assert!(
        front_seen.iter().any(|(p, _)| p == "/refs/acme/tiny.json"),
        "{front_seen:?}"
    );
    assert!(
        front_seen.iter().all(|(_, auth)| *auth),
        "the endpoint's origin gets the token"
    );
    let mirror_seen = mirror.requests();
    assert!(!mirror_seen.is_empty());
    assert!(
        mirror_seen.iter().all(|(_, auth)| !auth),
        "another origin never gets the token: {mirror_seen:?}"
    );
    let tree = blob_path(&commit);
    let asked = mirror_seen.iter().filter(|(p, _)| *p == tree).count();
    assert!(asked >= 2, "the broken answer was resumed: {mirror_seen:?}");
}

/// The reference CLI, when installed: `$TENSORFS_TEST_PYTHON`'s venv, else the shared cache.
fn reference_tfs() -> Option<PathBuf> {
    let from_python = std::env::var_os("TENSORFS_TEST_PYTHON")
        .map(PathBuf::from)
        .and_then(|python| Some(python.parent()?.join("tfs")));
    from_python.into_iter().find(|tfs| tfs.is_file())
}

fn conform(tfs: &Path, url: &str, extra: &[&str], env: &[(&str, &str)], scratch: &Path) -> String {
    let out = std::process::Command::new(tfs)
        .args(["conform", "endpoint", url])
        .args(extra)
        .current_dir(scratch)
        .env("HOME", scratch)
        .env_remove("TENSORFS_ENDPOINT")
        .env_remove("TENSORFS_TOKEN")
        .env("TENSORFS_HOME", scratch.join("tfs-home"))
        .envs(env.iter().copied())
        .output()
        .expect("tfs runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("tfs conform endpoint {url} {extra:?}:\n{said}");
    assert!(out.status.success(), "tfs conform failed:\n{said}");
    assert!(!said.contains("FAIL"), "{said}");
    said
}

#[test]
fn the_reference_conformance_suite_passes_against_our_server() {
    let Some(tfs) = reference_tfs() else {
        skip::missing("no reference `tfs` (set TENSORFS_TEST_PYTHON to a venv with tensorfs)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = published_store(dir.path());
    let open = Server::start(&origin, &["--write"], &[]);
    let said = conform(&tfs, &open.url, &["--write"], &[], dir.path());
    assert!(said.contains("pass  upload"), "{said}");
    conform(&tfs, &open.url, &[], &[], dir.path());
    drop(open);

    let token = "conformance-token";
    let guarded = Server::start(
        &origin,
        &["--write", "--token-env", "TFS_TEST_TOKEN"],
        &[("TFS_TEST_TOKEN", token)],
    );
    let env = [("TFS_TEST_TOKEN", token)];
    let write = ["--write", "--token-env", "TFS_TEST_TOKEN"];
    conform(&tfs, &guarded.url, &write, &env, dir.path());
    conform(&tfs, &guarded.url, &write[1..], &env, dir.path());
}

/// The biggest chunk of `commit`'s header.
fn biggest_chunk(root: &Path, commit: &ObjectRef) -> ObjectRef {
    let store = Store::open_existing(root).unwrap();
    let header = store.commit(commit).unwrap().header;
    *header.chunks.iter().max_by_key(|c| c.length).unwrap()
}

#[test]
fn a_failed_download_names_nothing_and_a_second_run_fetches_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commit) = published_store(dir.path());
    // A copy of the origin that lacks one chunk.
    let partial = dir.path().join("partial");
    for (path, bytes) in files_of(&origin) {
        let dest = partial.join(path);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(dest, bytes).unwrap();
    }
    let chunk = biggest_chunk(&origin, &commit);
    fs::remove_file(partial.join(chunk.blob_path())).unwrap();
    let lacking = StaticOrigin::start(&partial, StaticConfig::default());
    let local = dir.path().join("local");
    // The store exists before: a download that fails before it stores anything removes a
    // store made for it, and whether one lands first depends on the transfers' order.
    Store::open(&local).unwrap();
    let out = download(&local, &["acme/tiny@1.0", "--endpoint", &lacking.url], &[]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(&chunk.sha256.hex()), "{said}");
    assert!(
        !local.join("refs/acme/tiny.json").exists(),
        "nothing names the commit"
    );
    ok(&local, &["verify"]);

    let server = Server::start(&origin, &[], &[]);
    let out = download(&local, &["acme/tiny@1.0", "--endpoint", &server.url], &[]);
    let said = succeeded(&out);
    assert!(!said.contains(" 0 of "), "{said}");
    assert_eq!(blobs(&local), blobs(&origin));
}

#[test]
fn a_damaged_blob_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commit) = published_store(dir.path());
    let chunk = biggest_chunk(&origin, &commit);
    let blob = origin.join(chunk.blob_path());
    let mut bytes = fs::read(&blob).unwrap();
    bytes[0] ^= 0xff;
    let mut permissions = fs::metadata(&blob).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    permissions.set_readonly(false);
    fs::set_permissions(&blob, permissions).unwrap();
    fs::write(&blob, &bytes).unwrap();

    let server = Server::start(&origin, &[], &[]);
    let answer = request(server.address(), "GET", &blob_path(&chunk), &[], b"");
    assert_eq!(answer.status, 500);
    assert!(!answer
        .body
        .windows(16)
        .any(|w| bytes.windows(16).next() == Some(w)));
    let local = dir.path().join("local");
    let out = download(&local, &["acme/tiny", "--endpoint", &server.url], &[]);
    assert!(!out.status.success());
    assert!(!local.join("refs/acme/tiny.json").exists());
}

#[test]
fn a_client_that_hangs_up_mid_answer_does_not_stop_the_server() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = published_store(dir.path());
    let big = Store::open_existing(&origin)
        .unwrap()
        .put_bytes(&vec![7u8; 16 << 20])
        .unwrap();
    let server = Server::start(&origin, &[], &[]);
    // A write to a connection the peer closed raises SIGPIPE, which kills by default: the
    // server ignores it (the write then fails with EPIPE, ending that connection only).
    let status = fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|mask| u64::from_str_radix(mask.trim(), 16).unwrap())
        .unwrap();
    assert_ne!(
        ignored & (1 << (libc::SIGPIPE - 1)),
        0,
        "SIGPIPE is ignored"
    );
    for _ in 0..20 {
        let mut stream = std::net::TcpStream::connect(server.address()).unwrap();
        let head = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", blob_path(&big));
        stream.write_all(head.as_bytes()).unwrap();
        let mut some = [0u8; 4096];
        stream.read_exact(&mut some).unwrap();
        drop(stream);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let head = request(server.address(), "HEAD", &blob_path(&big), &[], b"");
    assert_eq!(head.status, 200, "the server still answers");
}

#[test]
fn serve_with_write_makes_an_absent_store_and_serve_without_refuses() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("new");
    let err = fails(
        &absent,
        &["serve", absent.to_str().unwrap(), "--listen", "127.0.0.1:0"],
    );
    assert!(err.contains("not a store"), "{err}");
    assert!(!absent.exists(), "a read-only server creates no store");

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args(["serve", absent.to_str().unwrap(), "--write"])
        .args(["--listen", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let read = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let _ = child.kill();
    let _ = child.wait();
    read.unwrap();
    assert!(line.contains("read-write"), "{line}");
    assert!(absent.join("format").is_file(), "the store was made");
}

fn stored_bytes(root: &Path) -> u64 {
    blobs(root).values().map(|b| b.len() as u64).sum()
}

#[test]
fn download_keeps_the_cache_within_its_budget_evicting_the_least_recently_used_model() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, tiny) = published_store(dir.path());
    // A second model of other bytes, published as acme/big.
    let weights = dir.path().join("big.safetensors");
    let tensor = T(
        "w",
        safetensors::Dtype::F32,
        vec![1 << 18],
        floats(1 << 18, 7),
    );
    fs::write(&weights, safetensors_file(&[tensor], None)).unwrap();
    ok(
        &origin,
        &["import", weights.to_str().unwrap(), "--name", "local/big"],
    );
    let store = Store::open_existing(&origin).unwrap();
    let big = store.repo("local/big").unwrap().unwrap().commits[0];
    publish(&store, "acme/big", None, big);
    let server = Server::start(&origin, &[], &[]);
    let local = dir.path().join("local");

    succeeded(&download(
        &local,
        &["acme/tiny@1.0", "--endpoint", &server.url],
        &[],
    ));
    let tiny_bytes = stored_bytes(&local);
    // Used, then left for two hours: past the grace, as cache is once it is not new.
    age(&local.join("blobs"), std::time::Duration::from_secs(7200));
    age(&local.join("uses"), std::time::Duration::from_secs(7200));

    // A budget smaller than the model alone is refused before anything is fetched.
    let big_id = format!("acme/big@{}", big.id());
    let out = download(
        &local,
        &[&big_id, "--endpoint", &server.url, "--cache-size", "64K"],
        &[],
    );
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("more than the cache's budget of 64.00 KiB"),
        "{said}"
    );
    assert_eq!(stored_bytes(&local), tiny_bytes, "nothing fetched");
    // Into a store it would make: refused the same, leaving none.
    let fresh = dir.path().join("fresh");
    let out = download(
        &fresh,
        &[&big_id, "--endpoint", &server.url, "--cache-size", "64K"],
        &[],
    );
    assert!(!out.status.success());
    assert!(!fresh.exists(), "a refused download leaves no new store");

    let big_bytes = Store::open_existing(&origin)
        .unwrap()
        .commit(&big)
        .unwrap()
        .closure()
        .iter()
        .map(|o| o.length)
        .sum::<u64>();
    // The same budget where the model it would evict is young: refused after the collection
    // looked, and its use stays.
    let young = dir.path().join("young");
    succeeded(&download(
        &young,
        &["acme/tiny@1.0", "--endpoint", &server.url],
        &[],
    ));
    // Use records, not the collector's `.swept` mark.
    let uses = |root: &Path| {
        fs::read_dir(root.join("uses"))
            .unwrap()
            .filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
    };
    let before = uses(&young);
    let young_budget = (big_bytes + tiny_bytes / 2).to_string();
    let out = download(
        &young,
        &[
            &big_id,
            "--endpoint",
            &server.url,
            "--cache-size",
            &young_budget,
        ],
        &[],
    );
    assert!(!out.status.success());
    assert_eq!(uses(&young), before, "a refused download drops no use");

    // A budget that holds the new model but not both, while another process (this test) holds
    // the older model, as a mount's open file does: refused, for held cache counts too.
    let budget = big_bytes + tiny_bytes / 2;
    let budget_arg = budget.to_string();
    let held = Store::open_existing(&local).unwrap();
    let hold = held.hold(&held.commit(&tiny).unwrap().closure()).unwrap();
    // Both with --json: its report on success, and errors on stderr as without it.
    let within_budget = || {
        let args = [
            big_id.as_str(),
            "--endpoint",
            &server.url,
            "--cache-size",
            &budget_arg,
            "--json",
        ];
        download(&local, &args, &[])
    };
    let out = within_budget();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("held by a running process"), "{said}");
    assert_eq!(stored_bytes(&local), tiny_bytes, "nothing fetched");
    drop(hold);

    // Released, the older model goes, whole, and the report says so.
    let said = succeeded(&within_budget());
    let report: serde_json::Value = serde_json::from_str(&said).unwrap();
    let evicted = report["evicted"].as_array().expect("evicted listed");
    assert_eq!(evicted.len(), 1, "{report}");
    assert!(
        evicted[0]
            .as_str()
            .unwrap()
            .starts_with("acme/tiny@sha256:"),
        "{report}"
    );
    assert!(report["evicted_bytes"].as_u64().unwrap() > 0, "{report}");
    let after = stored_bytes(&local);
    assert!(
        after <= budget,
        "{after} bytes stored over a budget of {budget}"
    );
    assert!(
        !local.join("refs/acme/tiny.json").exists(),
        "the evicted model leaves the listing"
    );
    let listed = ok(&local, &["ls"]);
    assert!(listed.contains("acme/big"), "{listed}");
    ok(&local, &["verify"]);
}
