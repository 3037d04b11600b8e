//! What the command line says where a new user trips: a failed import into a new store, `ls`
//! before any import, `verify` of a damaged store, a text file named `.safetensors`, `unmount`
//! of a path that is not there.

mod common;

use std::fs;

use common::*;

/// A failed import into a store that did not exist leaves no store (nor the folders made for
/// it) behind.
#[test]
fn a_failed_import_into_a_new_store_leaves_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("bad.safetensors");
    fs::write(&src, b"this is not a safetensors file at all\n").unwrap();
    let store = dir.path().join("new").join("deeper").join("store");
    let said = fails(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/bad"],
    );
    assert!(said.contains("not a safetensors file"), "{said}");
    assert!(said.contains("\"this is "), "it quotes the text: {said}");
    assert!(
        !dir.path().join("new").exists(),
        "no store skeleton is left"
    );

    // A store that existed stays, with what it held.
    let good = dir.path().join("good");
    transformers_folder(&good);
    let store = dir.path().join("kept");
    ok(
        &store,
        &["import", good.to_str().unwrap(), "--name", "local/good"],
    );
    fails(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/bad"],
    );
    assert!(ok(&store, &["ls"]).contains("local/good/"));
}

#[test]
fn ls_before_any_import_says_how_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("nothing-here");
    let out = run(&store, &["ls"]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("nothing imported yet"), "{said}");
    assert!(said.contains("tensorfs import"), "{said}");
    assert!(!store.exists(), "ls creates nothing");
    assert_eq!(ok(&store, &["ls", "--json"]).trim(), "[]");
}

/// One commit under two repos is one commit; a damaged blob is named with the models that use
/// it, once; `--repair` removes it through the store.
#[test]
fn verify_counts_commits_once_and_names_the_models_a_damage_hits() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    transformers_folder(&src);
    let store = dir.path().join("store");
    let said = ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/one"],
    );
    assert!(said.contains("stored "), "{said}");
    assert!(said.contains(" new objects ("), "{said}");
    assert!(said.contains("4 tensors ("), "{said}");
    let said = ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/two"],
    );
    assert!(
        said.contains("nothing new stored"),
        "a re-import adds no object: {said}"
    );
    let said = ok(&store, &["verify"]);
    assert!(
        said.contains("of 1 commit\n") || said.trim_end().ends_with("of 1 commit"),
        "{said}"
    );

    // Damage the weights' chunk: the largest blob.
    let mut blobs: Vec<(u64, std::path::PathBuf)> = Vec::new();
    for a in fs::read_dir(store.join("blobs")).unwrap() {
        for b in fs::read_dir(a.unwrap().path()).unwrap() {
            for e in fs::read_dir(b.unwrap().path()).unwrap() {
                let e = e.unwrap();
                blobs.push((e.metadata().unwrap().len(), e.path()));
            }
        }
    }
    blobs.sort();
    let (len, path) = blobs.last().unwrap().clone();
    let mut perms = fs::metadata(&path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    fs::set_permissions(&path, perms).unwrap();
    fs::write(&path, vec![0u8; len as usize]).unwrap();

    let said = fails(&store, &["verify"]);
    let lines: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("damaged blob"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per damage: {said}");
    assert!(
        lines[0].contains("local/one") && lines[0].contains("local/two"),
        "{said}"
    );
    assert_eq!(lines[0].matches("--repair").count(), 1, "{said}");

    let said = fails(&store, &["verify", "--repair"]);
    assert!(said.contains("removed"), "{said}");
    assert!(!path.exists(), "the damaged blob is gone");
    let said = fails(&store, &["verify"]);
    assert!(said.contains("lacks 1 object"), "{said}");
    assert!(!said.contains("damaged"), "{said}");
}

#[test]
fn unmount_names_a_missing_path_and_says_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-mount");
    let said = fails(dir.path(), &["unmount", missing.to_str().unwrap()]);
    assert!(said.contains("does not exist"), "{said}");
    let said = fails(dir.path(), &["unmount", dir.path().to_str().unwrap()]);
    assert!(said.contains("not a TensorFS mount"), "{said}");
}

#[test]
fn unmount_help_offers_no_store() {
    let out = tensorfs().args(["unmount", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(!help.contains("--store"), "{help}");
    assert!(help.contains("--lazy"), "{help}");
    // Still accepted, as every verb accepts it.
    let dir = tempfile::tempdir().unwrap();
    let said = fails(dir.path(), &["unmount", "/nonexistent-mount"]);
    assert!(said.contains("does not exist"), "{said}");
    let out = tensorfs()
        .args(["unmount", "--store"])
        .arg(dir.path())
        .arg("/nonexistent-mount")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("does not exist"),
        "after the verb too: {said}"
    );
}

#[test]
fn help_shows_no_empty_environment_values() {
    for verb in ["mount", "download", "upload"] {
        let out = tensorfs()
            .args([verb, "--help"])
            .env_remove("TENSORFS_ENDPOINT")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(!help.contains("TENSORFS_ENDPOINT=]"), "{verb}: {help}");
        assert!(help.contains("TENSORFS_ENDPOINT"), "{verb}: {help}");
    }
}

/// `--store` on a regular file: the same words from every verb, the import's included.
#[test]
fn a_store_path_that_is_a_file_is_named_so_by_every_verb() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let src = dir.path().join("src");
    transformers_folder(&src);
    for args in [
        vec!["import", src.to_str().unwrap(), "--name", "local/x"],
        vec!["ls"],
        vec!["verify"],
        vec!["inspect", "local/x"],
    ] {
        let said = fails(&file, &args);
        assert!(
            said.contains("is a file, not a store folder"),
            "{args:?}: {said}"
        );
    }
    assert_eq!(fs::read(&file).unwrap(), b"x");
}
