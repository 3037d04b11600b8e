//! Hub identities at import (`--hf-id`, or a hub cache snapshot folder's own path): recorded
//! beside the refs, never in ids.

mod common;
mod skip;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

const REV: &str = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";

/// The commit ids `import` printed.
fn commits(said: &str) -> Vec<String> {
    said.lines()
        .filter_map(|l| l.strip_prefix("imported "))
        .filter_map(|l| l.split('@').nth(1)?.split(' ').next().map(str::to_owned))
        .collect()
}

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

/// A hub cache written by huggingface_hub itself (`tools/fixtures/hub_cache.py`: its
/// `snapshot_download` against a loopback server speaking the hub's routes). Returns the
/// fixture's JSON line: the commit, the snapshot folder and each file's etag.
fn hub_cache(python: &Path, folder: &Path, repo: &str, cache: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/hub_cache.py");
    let out = Command::new(python)
        .arg(script)
        .arg("--folder")
        .arg(folder)
        .args(["--repo", repo])
        .arg("--cache")
        .arg(cache)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "hub_cache.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).unwrap()
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
    let made = hub_cache(Path::new(&python), &src, "acme/tiny-bert", &cache);
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
