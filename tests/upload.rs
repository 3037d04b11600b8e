//! `tensorfs upload` end to end: to `tensorfs serve --write` (through a proxy that counts and
//! fails requests), to a store directory (`file://`), to a real S3 server (`s3s-fs`), and back
//! by `tensorfs download`, also from nginx serving what an upload wrote.

mod common;
#[path = "common/http.rs"]
mod http;
#[path = "common/origins.rs"]
mod origins;
mod skip;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;
use http::{Proxy, ProxyConfig, Server};
use origins::{Nginx, S3Server};
use tensorfs::format::ObjectRef;
use tensorfs::store::Store;

/// A store with a Transformers folder imported as `local/tiny`: two lanes, the default weights
/// and an `fp16` variant. Returns the store and its commits, in the repo's order.
fn imported_store(dir: &Path) -> (PathBuf, Vec<ObjectRef>) {
    let folder = dir.join("folder");
    transformers_folder(&folder);
    let half = safetensors_file(
        &[
            T(
                "embeddings.word_embeddings.weight",
                safetensors::Dtype::F16,
                vec![16, 8],
                bytes(256, 7),
            ),
            T(
                "encoder.layer.0.attention.self.query.weight",
                safetensors::Dtype::F16,
                vec![8, 8],
                bytes(128, 8),
            ),
        ],
        Some(&[("format", "pt")]),
    );
    fs::write(folder.join("model.fp16.safetensors"), half).unwrap();
    let root = dir.join("origin");
    ok(
        &root,
        &["import", folder.to_str().unwrap(), "--name", "local/tiny"],
    );
    let commits = Store::open_existing(&root)
        .unwrap()
        .repo("local/tiny")
        .unwrap()
        .unwrap()
        .commits;
    assert_eq!(commits.len(), 2, "two lanes");
    (root, commits)
}

/// Unmounts a mount made through the CLI when dropped, also when a test fails.
struct CliMount(PathBuf);

impl Drop for CliMount {
    fn drop(&mut self) {
        let _ = tensorfs().args(["unmount", "--lazy"]).arg(&self.0).output();
    }
}

/// A lazy mount of `endpoint` into an empty store lists the bucket's models (`acme/tiny` and
/// `acme/fork`) and shows every lane of the origin's `local/tiny` with the files `export` writes.
fn lazy_mount_equals(dir: &Path, origin: &Path, endpoint: &str, env: &[(&str, String)]) {
    let store = empty_store(&dir.join("lazy-store"));
    let mnt = dir.join("lazy-mnt");
    fs::create_dir_all(&mnt).unwrap();
    let log = dir.join("lazy-mount.log");
    let args = [
        "mount",
        mnt.to_str().unwrap(),
        "--endpoint",
        endpoint,
        "--log-file",
        log.to_str().unwrap(),
    ];
    succeeded(&tensorfs_in(&store, args[0], &args[1..], env));
    let guard = CliMount(mnt.clone());
    let mut listed: Vec<String> = fs::read_dir(mnt.join("acme"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        ["fork", "tiny"],
        "the bucket's refs list its models"
    );
    let latest = mnt.join("acme/tiny/latest");
    let lanes: Vec<String> = fs::read_dir(&latest)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|l| !l.contains('@'))
        .collect();
    assert_eq!(lanes.len(), 2, "{lanes:?}");
    for lane in lanes {
        let out = dir.join(format!("export-{lane}"));
        ok(
            origin,
            &[
                "export",
                "local/tiny",
                out.to_str().unwrap(),
                "--lane",
                &lane,
            ],
        );
        assert_eq!(files_of(&latest.join(&lane)), files_of(&out), "lane {lane}");
    }
    drop(guard);
}

/// An empty store for a server.
fn empty_store(path: &Path) -> PathBuf {
    Store::open(path).unwrap();
    path.to_path_buf()
}

/// Runs `tensorfs --store STORE VERB ARGS` with `env` and no other endpoint or AWS settings.
fn tensorfs_in(store: &Path, verb: &str, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut command = tensorfs();
    command.arg("--store").arg(store).arg(verb).args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("AWS_") || key == "TENSORFS_ENDPOINT" || key == "TENSORFS_TOKEN" {
            command.env_remove(key);
        }
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the binary runs")
}

fn upload(store: &Path, endpoint: &str, extra: &[&str], env: &[(&str, String)]) -> Output {
    let mut args = vec!["local/tiny", "acme/tiny", "--endpoint", endpoint];
    args.extend_from_slice(extra);
    tensorfs_in(store, "upload", &args, env)
}

fn download(store: &Path, endpoint: &str, extra: &[&str], env: &[(&str, String)]) -> Output {
    let mut args = vec!["acme/tiny", "--endpoint", endpoint];
    args.extend_from_slice(extra);
    tensorfs_in(store, "download", &args, env)
}

fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tensorfs failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "tensorfs should have failed");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!said.contains("panicked"), "{said}");
    said
}

/// Every blob under `root` (a store or a bucket's prefix), path → bytes.
fn blobs(root: &Path) -> BTreeMap<String, Vec<u8>> {
    files_of(&root.join("blobs"))
}

/// The lane of each commit of `store`, by commit.
fn lanes(store: &Path, commits: &[ObjectRef]) -> BTreeMap<String, ObjectRef> {
    let store = Store::open_existing(store).unwrap();
    commits
        .iter()
        .map(|c| (store.tree(c).unwrap().lane.unwrap(), *c))
        .collect()
}

/// Downloads each lane of `acme/tiny` from `endpoint` into a fresh store `dir/<tag>` and checks
/// it holds the origin's objects, byte for byte, names both commits and exports the same files.
fn downloads_equal(
    dir: &Path,
    tag: &str,
    origin: &Path,
    commits: &[ObjectRef],
    endpoint: &str,
    env: &[(&str, String)],
) {
    let local = dir.join(tag);
    for (lane, commit) in lanes(origin, commits) {
        let out = download(&local, endpoint, &["--lane", &lane], env);
        let said = succeeded(&out);
        assert!(said.contains(&commit.id()), "{said}");
    }
    assert_eq!(blobs(&local), blobs(origin), "the same objects");
    let repo = Store::open_existing(&local)
        .unwrap()
        .repo("acme/tiny")
        .unwrap()
        .unwrap();
    let mut named = repo.commits.clone();
    named.sort();
    let mut expected = commits.to_vec();
    expected.sort();
    assert_eq!(named, expected);
    ok(&local, &["verify"]);
    let fp16 = |store: &Path, out: PathBuf| {
        let commit = lanes(store, commits)["fp16"];
        let reference = format!("sha256:{}", commit.sha256);
        ok(store, &["export", &reference, out.to_str().unwrap()]);
        files_of(&out)
    };
    assert_eq!(
        fp16(origin, dir.join(format!("{tag}-origin-export"))),
        fp16(&local, dir.join(format!("{tag}-export")))
    );
}

/// The number of objects in the closures of `commits` in `store`.
fn closure_size(store: &Path, commits: &[ObjectRef]) -> usize {
    let store = Store::open_existing(store).unwrap();
    let mut all = std::collections::BTreeSet::new();
    for id in commits {
        let commit = store.commit(id).unwrap();
        all.insert(*id);
        all.insert(commit.header_ref);
        all.extend(commit.header.objects().copied());
        all.extend(commit.tree.repo_files().map(|(_, o)| *o));
    }
    all.len()
}

/// Checks that every `PUT` a proxy saw carried `If-None-Match: *` and the base64 SHA-256 of
/// the digest its path names; returns how many there were.
fn puts_carry_digest_and_condition(proxy: &Proxy) -> usize {
    use base64::Engine as _;
    let puts: Vec<http::Seen> = proxy
        .requests()
        .into_iter()
        .filter(|s| s.method == "PUT" && s.path.contains("/blobs/"))
        .collect();
    for put in &puts {
        let hex = put.path.rsplit('/').next().unwrap();
        let digest: tensorfs::format::Sha256 = hex.parse().unwrap();
        let checksum = base64::engine::general_purpose::STANDARD.encode(digest.0);
        assert_eq!(
            put.header("x-amz-checksum-sha256"),
            Some(&*checksum),
            "{put:?}"
        );
        assert_eq!(put.header("if-none-match"), Some("*"), "{put:?}");
        assert!(put.header("content-length").is_some(), "{put:?}");
    }
    puts.len()
}

#[test]
fn an_upload_to_a_server_is_downloaded_as_the_same_repo_and_objects() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commits) = imported_store(dir.path());
    let total = closure_size(&origin, &commits);
    let served = empty_store(&dir.path().join("served"));
    let server = Server::start(&served, &["--write"], &[]);
    let proxy = Proxy::start(&server.url, ProxyConfig::default());

    let said = succeeded(&upload(&origin, &proxy.url, &[], &[]));
    assert!(
        said.contains(&format!("{total} of {total} objects sent")),
        "{said}"
    );
    assert_eq!(blobs(&served), blobs(&origin), "every object arrived");
    let repo = Store::open_existing(&served)
        .unwrap()
        .repo("acme/tiny")
        .unwrap()
        .unwrap();
    assert_eq!(repo.commits, commits, "recorded in the source's order");

    // The spec's order: leaves, then headers, then trees, then the commits; each PUT after
    // its HEAD and followed by a confirming HEAD.
    let seen = proxy.requests();
    assert!(
        seen.iter().all(|s| s.status < 400 || s.method == "HEAD"),
        "{seen:#?}"
    );
    let store = Store::open_existing(&origin).unwrap();
    let kind = |path: &str| -> u8 {
        let hex = path.rsplit('/').next().unwrap();
        if commits.iter().any(|c| c.sha256.hex() == hex) {
            2
        } else if commits
            .iter()
            .any(|c| store.commit(c).unwrap().header_ref.sha256.hex() == hex)
        {
            1
        } else {
            0
        }
    };
    let put_kinds: Vec<u8> = seen
        .iter()
        .filter(|s| s.method == "PUT")
        .map(|s| kind(&s.path))
        .collect();
    assert_eq!(put_kinds.len(), total);
    assert_eq!(puts_carry_digest_and_condition(&proxy), total);
    assert!(put_kinds.windows(2).all(|w| w[0] <= w[1]), "{put_kinds:?}");
    let first_post = seen.iter().position(|s| s.method == "POST").unwrap();
    let last_put = seen.iter().rposition(|s| s.method == "PUT").unwrap();
    assert!(first_post > last_put);
    assert_eq!(proxy.count("POST", "/v1/models/acme/tiny/commits"), 2);
    for put in seen.iter().filter(|s| s.method == "PUT") {
        let heads = seen
            .iter()
            .filter(|s| s.method == "HEAD" && s.path == put.path)
            .count();
        assert_eq!(heads, 2, "HEAD before and after the PUT of {}", put.path);
    }

    downloads_equal(
        dir.path(),
        "from-server",
        &origin,
        &commits,
        &server.url,
        &[],
    );

    // Again: each tree is there, so its closure is, and nothing is sent.
    let before = proxy.requests().len();
    let said = succeeded(&upload(&origin, &proxy.url, &[], &[]));
    assert!(
        said.contains(&format!("0 of {total} objects sent")),
        "{said}"
    );
    assert!(said.contains("named already"), "{said}");
    let again: Vec<_> = proxy.requests()[before..].to_vec();
    let methods: Vec<&str> = again.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(methods, ["HEAD", "HEAD", "POST", "POST"], "{again:#?}");
}

#[test]
fn an_interrupted_upload_resumes_and_sends_only_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commits) = imported_store(dir.path());
    let total = closure_size(&origin, &commits);
    let served = empty_store(&dir.path().join("served"));
    let server = Server::start(&served, &["--write"], &[]);
    let failing = Proxy::start(
        &server.url,
        ProxyConfig {
            fail_puts_after: Some(3),
            ..ProxyConfig::default()
        },
    );
    let said = failed(&upload(&origin, &failing.url, &["--jobs", "1"], &[]));
    assert!(said.contains("500"), "{said}");
    assert_eq!(failing.count("POST", "/"), 0, "nothing was recorded");
    assert!(Store::open_existing(&served)
        .unwrap()
        .repo("acme/tiny")
        .unwrap()
        .is_none());
    let stored = blobs(&served).len();
    assert_eq!(stored, 3, "the objects sent before the failure stay");

    let proxy = Proxy::start(&server.url, ProxyConfig::default());
    let said = succeeded(&upload(&origin, &proxy.url, &[], &[]));
    let rest = total - stored;
    assert!(
        said.contains(&format!("{rest} of {total} objects sent")),
        "{said}"
    );
    assert_eq!(
        proxy.count("PUT", "/blobs/"),
        rest,
        "only the missing objects"
    );
    assert_eq!(blobs(&served), blobs(&origin));
    assert_eq!(
        Store::open_existing(&served)
            .unwrap()
            .repo("acme/tiny")
            .unwrap()
            .unwrap()
            .commits,
        commits
    );
}

#[test]
fn a_412_is_taken_as_present_and_tokens_guard_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commits) = imported_store(dir.path());
    let total = closure_size(&origin, &commits);
    let served = empty_store(&dir.path().join("served"));
    let token = "upload-token".to_string();
    let server = Server::start(
        &served,
        &["--write", "--token-env", "TFS_TEST_TOKEN"],
        &[("TFS_TEST_TOKEN", &token)],
    );
    let said = failed(&upload(&origin, &server.url, &[], &[]));
    assert!(said.contains("401") && said.contains("--token"), "{said}");
    let with_token = [("TENSORFS_TOKEN", token.clone())];
    succeeded(&upload(&origin, &server.url, &[], &with_token));

    // Every HEAD says absent, so each object is PUT, and the server's 412 is success.
    let liar = Proxy::start(
        &server.url,
        ProxyConfig {
            blobs_look_absent: true,
            ..ProxyConfig::default()
        },
    );
    let said = succeeded(&upload(&origin, &liar.url, &["--token", &token], &[]));
    assert!(
        said.contains(&format!("0 of {total} objects sent")),
        "{said}"
    );
    let puts: Vec<u16> = liar
        .requests()
        .iter()
        .filter(|s| s.method == "PUT")
        .map(|s| s.status)
        .collect();
    assert_eq!(puts.len(), total);
    assert!(puts.iter().all(|s| *s == 412), "{puts:?}");

    // A read-only server takes none.
    let read_only = Server::start(&served, &[], &[]);
    let said = failed(&upload(&origin, &read_only.url, &[], &[]));
    assert!(said.contains("takes no uploads"), "{said}");
}

#[test]
fn a_damaged_blob_is_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commits) = imported_store(dir.path());
    let store = Store::open_existing(&origin).unwrap();
    let chunk = *store
        .commit(&commits[0])
        .unwrap()
        .header
        .chunks
        .iter()
        .max_by_key(|c| c.length)
        .unwrap();
    let blob = origin.join(chunk.blob_path());
    let mut bytes = fs::read(&blob).unwrap();
    bytes[0] ^= 0xff;
    fs::remove_file(&blob).unwrap();
    fs::write(&blob, &bytes).unwrap();

    let served = empty_store(&dir.path().join("served"));
    let server = Server::start(&served, &["--write"], &[]);
    let proxy = Proxy::start(&server.url, ProxyConfig::default());
    let said = failed(&upload(&origin, &proxy.url, &[], &[]));
    assert!(said.contains(&chunk.sha256.hex()), "{said}");
    let path = format!("/{}", chunk.blob_path());
    assert_eq!(proxy.count("PUT", &path), 0, "its bytes were not sent");
    assert_eq!(proxy.count("POST", "/"), 0);
}

#[test]
fn one_lane_is_uploaded_to_a_store_directory_and_downloaded_back() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, commits) = imported_store(dir.path());
    let mirror = dir.path().join("mirror");
    let url = format!("file://{}", mirror.display());
    let by_lane = lanes(&origin, &commits);
    let said = succeeded(&upload(&origin, &url, &["--lane", "fp16"], &[]));
    assert!(said.contains(&by_lane["fp16"].id()), "{said}");
    let repo = Store::open_existing(&mirror)
        .unwrap()
        .repo("acme/tiny")
        .unwrap()
        .unwrap();
    assert_eq!(repo.commits, [by_lane["fp16"]]);
    let said = failed(&upload(&origin, &url, &["--lane", "int4"], &[]));
    assert!(
        said.contains("no lane \"int4\"") && said.contains("fp16"),
        "{said}"
    );

    succeeded(&upload(&origin, &url, &[], &[]));
    ok(&mirror, &["verify"]);
    downloads_equal(dir.path(), "from-dir", &origin, &commits, &url, &[]);
    let said = failed(&tensorfs_in(
        &origin,
        "upload",
        &["local/tiny", "local/copy", "--endpoint", &url],
        &[],
    ));
    assert!(said.contains("`local`"), "{said}");
}

#[test]
fn nginx_serves_an_uploaded_directory_as_a_static_origin() {
    let Some(nginx) = Nginx::binary() else {
        skip::missing("nginx is not installed (apt-get install nginx; tools/test.sh does)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (origin, commits) = imported_store(dir.path());
    let mirror = dir.path().join("mirror");
    let url = format!("file://{}", mirror.display());
    succeeded(&upload(&origin, &url, &[], &[]));
    let web = Nginx::start(&nginx, &mirror, &dir.path().join("nginx"));
    downloads_equal(dir.path(), "from-nginx", &origin, &commits, &web.url, &[]);
    // A commit by id, from its HEAD.
    let local = dir.path().join("by-id");
    let reference = format!("acme/tiny@sha256:{}", commits[0].sha256);
    succeeded(&tensorfs_in(
        &local,
        "download",
        &[&reference, "--endpoint", &web.url],
        &[],
    ));
    // A static host takes no uploads.
    let said = failed(&upload(&origin, &web.url, &[], &[]));
    assert!(said.contains("takes no uploads"), "{said}");
}

#[test]
fn an_s3_bucket_takes_uploads_and_serves_downloads() {
    let Some(binary) = S3Server::binary() else {
        skip::missing(
            "no s3s-fs (cargo install s3s-fs --version 0.14.1 --features binary; \
             tools/test.sh installs it, or set TENSORFS_TEST_S3S)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (origin, commits) = imported_store(dir.path());
    let total = closure_size(&origin, &commits);
    let s3 = S3Server::start(&binary, &dir.path().join("s3"), "models");
    let env = s3.env();
    let bucket = "s3://models/mirror/v1";
    // Through a proxy that sees the S3 requests (SigV4 signs the Host it passes on).
    let proxy = Proxy::start(&s3.endpoint, ProxyConfig::default());
    let mut via_proxy = env.clone();
    via_proxy[0].1 = proxy.url.clone();
    let said = succeeded(&upload(&origin, bucket, &[], &via_proxy));
    assert!(
        said.contains(&format!("{total} of {total} objects sent")),
        "{said}"
    );
    assert_eq!(puts_carry_digest_and_condition(&proxy), total);
    // The bucket holds the store layout under its prefix.
    let prefix = s3.root.join("models/mirror/v1");
    assert_eq!(blobs(&prefix), blobs(&origin));
    let document = fs::read(prefix.join("refs/acme/tiny.json")).unwrap();
    let repo = tensorfs::format::Repo::from_json(&document).unwrap();
    assert_eq!(repo.commits, commits);

    let said = succeeded(&upload(&origin, bucket, &[], &env));
    assert!(
        said.contains(&format!("0 of {total} objects sent")),
        "{said}"
    );

    // HEADs that miss: every PUT meets the bucket's 412, which is success.
    let liar = Proxy::start(
        &s3.endpoint,
        ProxyConfig {
            blobs_look_absent: true,
            ..ProxyConfig::default()
        },
    );
    via_proxy[0].1 = liar.url.clone();
    let said = succeeded(&tensorfs_in(
        &origin,
        "upload",
        &["local/tiny", "acme/fork", "--endpoint", bucket],
        &via_proxy,
    ));
    assert!(
        said.contains(&format!("0 of {total} objects sent")),
        "{said}"
    );
    let statuses: Vec<u16> = liar
        .requests()
        .iter()
        .filter(|s| s.method == "PUT" && s.path.contains("/blobs/"))
        .map(|s| s.status)
        .collect();
    assert_eq!(statuses.len(), total);
    assert!(statuses.iter().all(|s| *s == 412), "{statuses:?}");
    assert!(prefix.join("refs/acme/fork.json").is_file());

    downloads_equal(dir.path(), "from-s3", &origin, &commits, bucket, &env);
    lazy_mount_equals(dir.path(), &origin, bucket, &env);

    // Wrong credentials are refused by the server.
    let mut wrong = env.clone();
    wrong[2].1 = "not-the-secret".into();
    let said = failed(&download(
        &dir.path().join("denied"),
        bucket,
        &["--lane", "fp16"],
        &wrong,
    ));
    assert!(
        said.contains("403") || said.to_lowercase().contains("signature"),
        "{said}"
    );

    // What the bucket holds is a static origin for nginx too.
    if let Some(nginx) = Nginx::binary() {
        let web = Nginx::start(&nginx, &prefix, &dir.path().join("nginx"));
        downloads_equal(dir.path(), "from-nginx", &origin, &commits, &web.url, &[]);
    } else {
        skip::missing("the nginx part: nginx is not installed");
    }
}
