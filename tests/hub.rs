//! Hub identities at import (`--hf-id`, or a hub cache snapshot folder's own path): recorded
//! beside the refs, never in ids.

mod common;

use std::fs;

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
