//! Hub identities at import (`--hf-id`, or a hub cache snapshot folder's own path): recorded
//! beside the refs, never in ids.

mod common;
mod skip;

use std::fs;
use std::path::Path;

use common::*;

const REV: &str = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";

#[test]
fn a_snapshot_folder_records_its_hub_id_and_revision_without_changing_ids() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    transformers_folder(&plain);
    let snapshot = dir
        .path()
        .join("hub/models--acme--tiny-bert/snapshots")
        .join(REV);
    transformers_folder(&snapshot);
    let store = dir.path().join("store");

    let from_plain = ok(
        &store,
        &["import", plain.to_str().unwrap(), "--name", "local/a"],
    );
    assert!(!from_plain.contains("hub repo"), "{from_plain}");
    let from_snapshot = ok(
        &store,
        &["import", snapshot.to_str().unwrap(), "--name", "local/b"],
    );
    assert!(
        from_snapshot.contains(&format!("recorded as hub repo acme/tiny-bert@{REV}")),
        "{from_snapshot}"
    );
    assert_eq!(
        commits(&from_plain),
        commits(&from_snapshot),
        "the same commits"
    );

    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(store.join("hub/local/b.json")).unwrap()).unwrap();
    assert_eq!(record["format"], "tensorfs.hub/1");
    assert_eq!(record["repo"], "local/b");
    assert_eq!(record["hub_id"], "acme/tiny-bert");
    assert_eq!(record["revisions"][0]["revision"], REV);
    assert_eq!(
        record["revisions"][0]["commits"].as_array().unwrap().len(),
        commits(&from_snapshot).len()
    );
    assert!(!store.join("hub/local/a.json").exists());
    // ls names each commit's hub identity (JSON: null where there is none).
    let listed = ok(&store, &["ls"]);
    let hub_line = format!("\thub acme/tiny-bert@{REV}");
    assert!(
        listed
            .lines()
            .filter(|l| l.starts_with("local/b/"))
            .all(|l| l.ends_with(&hub_line)),
        "{listed}"
    );
    assert!(
        listed.lines().any(|l| l.starts_with("local/b/")),
        "{listed}"
    );
    assert!(!listed
        .lines()
        .any(|l| l.starts_with("local/a/") && l.contains("hub")));
    let rows: serde_json::Value = serde_json::from_str(&ok(&store, &["ls", "--json"])).unwrap();
    for row in rows.as_array().unwrap() {
        match row["repo"].as_str().unwrap() {
            "local/b" => assert_eq!(row["hub"], format!("acme/tiny-bert@{REV}")),
            _ => assert!(row["hub"].is_null(), "{row}"),
        }
    }

    // --hf-id names any source; a bad one is refused before anything is written.
    let said = ok(
        &store,
        &[
            "import",
            plain.to_str().unwrap(),
            "--name",
            "local/c",
            "--hf-id",
            "Org/Model.v2",
        ],
    );
    assert!(
        said.contains("recorded as hub repo Org/Model.v2\n"),
        "{said}"
    );
    let before = snapshot_of(&store);
    for bad in ["a/b/c", "a/b@main", "a--b/c"] {
        let said = fails(
            &store,
            &[
                "import",
                plain.to_str().unwrap(),
                "--name",
                "local/d",
                "--hf-id",
                bad,
            ],
        );
        assert!(said.contains("hub id"), "{bad}: {said}");
    }
    assert_eq!(snapshot_of(&store), before);
    // The store still verifies (the record is no object and no ref).
    ok(&store, &["verify"]);
}

fn snapshot_of(store: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    snapshot(store)
}

/// A snapshot of a real cache (files are links to `../../blobs/<etag>`) imports to the same
/// commits as the folder it was made from, and records the hub id and commit.
#[test]
fn a_snapshot_of_a_cache_huggingface_hub_wrote_imports_as_its_source_with_its_identity() {
    let Some(python) = std::env::var_os("TENSORFS_TEST_PYTHON") else {
        skip::missing("TENSORFS_TEST_PYTHON is not set (a venv with huggingface_hub)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    transformers_folder(&src);
    let cache = dir.path().join("cache");
    let made = hub_cache(Path::new(&python), &src, "acme/tiny-bert", "main", &cache);
    let commit = made["commit"].as_str().unwrap();
    let snapshot = Path::new(made["snapshot"].as_str().unwrap());
    assert!(
        fs::symlink_metadata(snapshot.join("config.json"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "huggingface_hub links snapshot files to blobs"
    );
    let store = dir.path().join("store");
    let plain = ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/plain"],
    );
    let cached = ok(
        &store,
        &[
            "import",
            snapshot.to_str().unwrap(),
            "--name",
            "local/cached",
        ],
    );
    assert_eq!(commits(&plain), commits(&cached));
    assert!(cached.contains("nothing new stored"), "{cached}");
    assert!(
        cached.contains(&format!("recorded as hub repo acme/tiny-bert@{commit}")),
        "{cached}"
    );
}

/// The blob a snapshot file links to (`../../blobs/<etag>`).
fn blob_of(snapshot: &Path, file: &str) -> std::path::PathBuf {
    let link = snapshot.join(file);
    let target = fs::read_link(&link).unwrap();
    link.parent().unwrap().join(target)
}

/// Every path under `root` (links not followed) with its kind, size, mtime and bytes: what a
/// reader of the cache would see changed.
fn cache_state(root: &Path) -> Vec<(String, u64, i64, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let meta = fs::symlink_metadata(e.path()).unwrap();
            let bytes = match meta.file_type() {
                t if t.is_dir() => {
                    stack.push(e.path());
                    Vec::new()
                }
                t if t.is_symlink() => fs::read_link(e.path())
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes(),
                _ => fs::read(e.path()).unwrap(),
            };
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            out.push((
                rel,
                meta.size(),
                meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
                bytes,
            ));
        }
    }
    out.sort();
    out
}

/// `import --hf-cache`: every model snapshot of a cache huggingface_hub wrote, each file
/// checked against its etag and the tree listing; a damaged, a partial and a dangling snapshot
/// are skipped naming the file while the rest is imported; a second run reads nothing; the
/// cache is never written.
#[test]
fn a_whole_hub_cache_imports_skipping_damaged_partial_and_dangling_snapshots() {
    let Some(python) = std::env::var_os("TENSORFS_TEST_PYTHON") else {
        skip::missing("TENSORFS_TEST_PYTHON is not set (a venv with huggingface_hub)");
        return;
    };
    let python = Path::new(&python);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mut made = std::collections::BTreeMap::new();
    for (i, repo) in [
        "acme/good",
        "acme/damaged",
        "acme/partial",
        "acme/dangling",
        "solo",
        "acme/subset",
    ]
    .iter()
    .enumerate()
    {
        let src = dir.path().join(format!("src{i}"));
        transformers_folder(&src);
        // Each repo's own README, so the caches differ.
        fs::write(src.join("README.md"), format!("# {repo}\n")).unwrap();
        made.insert(*repo, hub_cache(python, &src, repo, "main", &cache));
    }
    let snapshot = |repo: &str| Path::new(made[repo]["snapshot"].as_str().unwrap()).to_path_buf();
    // Damaged: one byte of the weights' blob flipped (its etag is the SHA-256).
    let weights = blob_of(&snapshot("acme/damaged"), "model.safetensors");
    let mut bytes = fs::read(&weights).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    fs::write(&weights, bytes).unwrap();
    // Partial: a download that did not finish (its blob is still `<etag>.incomplete`).
    fs::remove_file(snapshot("acme/partial").join("vocab.txt")).unwrap();
    let etag = made["acme/partial"]["files"]["vocab.txt"].as_str().unwrap();
    let blobs = cache.join("models--acme--partial/blobs");
    fs::rename(blobs.join(etag), blobs.join(format!("{etag}.incomplete"))).unwrap();
    // An unreadable listing is ignored (as huggingface_hub ignores it): the links still check.
    let solo = made["solo"]["commit"].as_str().unwrap();
    fs::write(
        cache.join(format!("models--solo/trees/{solo}.json")),
        b"{not json",
    )
    .unwrap();
    // Not asked for (allow_patterns): a file of the listing never downloaded is no damage.
    fs::remove_file(snapshot("acme/subset").join("README.md")).unwrap();
    // Dangling: the blob behind a link is gone.
    fs::remove_file(blob_of(&snapshot("acme/dangling"), "tokenizer.json")).unwrap();
    // Not models: a dataset repo, and huggingface_hub's own folders.
    fs::create_dir_all(cache.join("datasets--acme--data/snapshots")).unwrap();
    let before = cache_state(&cache);

    let store = dir.path().join("store");
    let out = run(&store, &["import", "--hf-cache", cache.to_str().unwrap()]);
    let (said, errors) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{said}\n{errors}");
    let good = made["acme/good"]["commit"].as_str().unwrap();
    assert!(
        said.contains(&format!("acme/good@{good} → local/acme--good imported")),
        "{said}"
    );
    assert!(
        said.contains("solo@") && said.contains("→ local/solo imported"),
        "{said}"
    );
    for (repo, file, what) in [
        (
            "acme/damaged",
            "model.safetensors",
            "damaged: its SHA-256 is",
        ),
        (
            "acme/partial",
            "",
            "partial: the download of 1 of the 6 files its tree listing names did not finish (vocab.txt)",
        ),
        ("acme/dangling", "tokenizer.json", "a dangling link"),
    ] {
        let line = errors
            .lines()
            .find(|l| l.contains(&format!("skipped {repo}@")))
            .unwrap_or_else(|| panic!("{repo} not skipped:\n{errors}"));
        assert!(line.contains(what), "{line}");
        let named = match file {
            "" => snapshot(repo),
            file => snapshot(repo).join(file),
        };
        assert!(line.contains(&format!("{}: ", named.display())), "{line}");
    }
    assert!(
        errors.contains("not a tree listing") && errors.contains("checked without it"),
        "{errors}"
    );
    assert!(
        errors.contains("1 of the 6 files its tree listing names were not downloaded (README.md)"),
        "{errors}"
    );
    assert!(
        errors.contains("datasets--acme--data: a dataset repo, not a model"),
        "{errors}"
    );
    assert!(
        said.contains("6 snapshots of 6 model repos")
            && said.contains("3 imported, 0 up to date, 3 skipped"),
        "{said}"
    );
    assert_eq!(cache_state(&cache), before, "the cache is only read");
    let listed = ok(&store, &["ls"]);
    assert!(
        listed.contains(&format!("hub acme/good@{good}")),
        "{listed}"
    );
    for absent in ["damaged", "partial", "dangling"] {
        assert!(!listed.contains(absent), "{listed}");
    }
    ok(&store, &["verify"]);

    // Again: what was imported is up to date without reading a byte.
    let again: serde_json::Value = serde_json::from_str(&ok(
        &store,
        &["import", "--hf-cache", cache.to_str().unwrap(), "--json"],
    ))
    .unwrap();
    let summary = &again["summary"];
    assert_eq!(
        (
            summary["imported"].as_u64(),
            summary["up_to_date"].as_u64(),
            summary["skipped"].as_u64()
        ),
        (Some(0), Some(3), Some(3)),
        "{again}"
    );
    assert_eq!(summary["bytes_read"], 0, "{again}");
    assert_eq!(summary["new_bytes"], 0, "{again}");
    // A repaired snapshot is imported on the next run, and nothing else is.
    fs::remove_dir_all(snapshot("acme/partial")).unwrap();
    let src = dir.path().join("src2");
    hub_cache(python, &src, "acme/partial", "main", &cache);
    let said = ok(&store, &["import", "--hf-cache", cache.to_str().unwrap()]);
    assert!(
        said.contains("1 imported, 3 up to date, 2 skipped"),
        "{said}"
    );

    // The default cache is huggingface_hub's: HF_HUB_CACHE first.
    let out = tensorfs()
        .arg("--store")
        .arg(&store)
        .args(["import", "--hf-cache"])
        .env("HF_HUB_CACHE", &cache)
        .env("HF_HOME", dir.path().join("elsewhere"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("model repos in {}", cache.display())),
        "{said}"
    );
}

/// A shard its index names is missing from the snapshot with no download left unfinished: the
/// model cannot load, so the snapshot is partial and skipped, naming the index and the shard.
#[test]
fn a_snapshot_missing_a_shard_its_index_names_is_partial() {
    let Some(python) = std::env::var_os("TENSORFS_TEST_PYTHON") else {
        skip::missing("TENSORFS_TEST_PYTHON is not set (a venv with huggingface_hub)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let shard = |key: &str, seed: u8| {
        safetensors_file(
            &[T(key, safetensors::Dtype::F32, vec![4], bytes(16, seed))],
            None,
        )
    };
    let index = br#"{"metadata": {"total_size": 32}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}"#;
    write_tree(
        &src,
        &[
            ("config.json", br#"{"model_type": "bert"}"#.to_vec()),
            ("model-00001-of-00002.safetensors", shard("a.weight", 1)),
            ("model-00002-of-00002.safetensors", shard("b.weight", 2)),
            ("model.safetensors.index.json", index.to_vec()),
        ],
    );
    let cache = dir.path().join("cache");
    let made = hub_cache(Path::new(&python), &src, "acme/sharded", "main", &cache);
    let snapshot = Path::new(made["snapshot"].as_str().unwrap()).to_path_buf();
    let missing = "model-00002-of-00002.safetensors";
    fs::remove_file(blob_of(&snapshot, missing)).unwrap();
    fs::remove_file(snapshot.join(missing)).unwrap();

    let store = dir.path().join("store");
    let out = run(&store, &["import", "--hf-cache", cache.to_str().unwrap()]);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{errors}");
    let line = errors
        .lines()
        .find(|l| l.contains("skipped acme/sharded@"))
        .unwrap_or_else(|| panic!("not skipped:\n{errors}"));
    assert!(line.contains("partial"), "{line}");
    assert!(
        line.contains("model.safetensors.index.json") && line.contains(missing),
        "the line names the index and the shard: {line}"
    );
    assert!(!store.exists(), "nothing imported, no store made");
}

#[test]
fn an_empty_cache_imports_nothing_and_makes_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    fs::create_dir_all(cache.join(".locks")).unwrap();
    let store = dir.path().join("store");
    let said = ok(&store, &["import", "--hf-cache", cache.to_str().unwrap()]);
    assert!(said.contains("0 snapshots of 0 model repos"), "{said}");
    assert!(
        !store.exists(),
        "an empty store was left at {}",
        store.display()
    );
}

/// A snapshot in huggingface_hub's layout, written by hand: `files` as blobs named by their
/// SHA-256 (the etag of LFS files), linked from `snapshots/<rev>/`, with `refs/main`.
fn cached_snapshot(cache: &Path, repo: &str, rev: &str, files: &[(&str, Vec<u8>)]) {
    let root = cache.join(format!("models--{}", repo.replace('/', "--")));
    fs::create_dir_all(root.join("blobs")).unwrap();
    fs::create_dir_all(root.join("refs")).unwrap();
    fs::write(root.join("refs/main"), rev).unwrap();
    let snapshot = root.join("snapshots").join(rev);
    fs::create_dir_all(&snapshot).unwrap();
    for (name, bytes) in files {
        let etag = tensorfs::format::ObjectRef::of(bytes).sha256.hex();
        fs::write(root.join("blobs").join(&etag), bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{etag}"), snapshot.join(name)).unwrap();
    }
}

/// Ctrl-C while a later snapshot is imported stops it, says which stayed, and keeps the
/// snapshots imported before it.
#[test]
fn an_interrupted_cache_import_keeps_the_snapshots_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let small = safetensors_file(
        &[T(
            "conv_first.weight",
            safetensors::Dtype::F32,
            vec![4],
            bytes(16, 1),
        )],
        None,
    );
    cached_snapshot(
        &cache,
        "acme/a-small",
        &"a".repeat(40),
        &[("model.safetensors", small)],
    );
    let tensors: Vec<T> = (0..12)
        .map(|i| {
            T(
                Box::leak(format!("layer.{i}.weight").into_boxed_str()),
                safetensors::Dtype::U8,
                vec![32 << 20],
                bytes(32 << 20, i as u8),
            )
        })
        .collect();
    let big = safetensors_file(&tensors, None);
    drop(tensors);
    cached_snapshot(
        &cache,
        "acme/b-big",
        &"b".repeat(40),
        &[("model.safetensors", big)],
    );
    let store = dir.path().join("store");
    let child = tensorfs()
        .args(["--store", store.to_str().unwrap(), "import", "--hf-cache"])
        .arg(&cache)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first is in once its repo is; the second is being written once a chunk is staged.
    let start = std::time::Instant::now();
    while !(store.join("refs/local/acme--a-small.json").exists() && staging(&store)) {
        assert!(
            start.elapsed().as_secs() < 60,
            "the import never reached the second snapshot"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // SAFETY: a signal to the child we spawned.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "it finished before the signal: {said}"
    );
    assert!(
        said.contains(&format!(
            "interrupted: acme/b-big@{} was not imported; the 1 snapshot imported before it stay in the store",
            "b".repeat(40)
        )),
        "{said}"
    );
    let listed = ok(&store, &["ls"]);
    assert!(listed.contains("local/acme--a-small"), "{listed}");
    assert!(!listed.contains("b-big"), "{listed}");
    ok(&store, &["verify"]);
}
