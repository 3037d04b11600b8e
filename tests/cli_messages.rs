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

/// The small Transformers folder imported as `local/one` into a new store under `dir`:
/// the folder, the store, and what `import` said.
fn imported_tiny(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let src = dir.join("src");
    transformers_folder(&src);
    let store = dir.join("store");
    let said = ok(
        &store,
        &["import", src.to_str().unwrap(), "--name", "local/one"],
    );
    (src, store, said)
}

/// The largest blob of `store` (the weights' chunk of a small import).
fn largest_blob(store: &std::path::Path) -> std::path::PathBuf {
    let mut blobs: Vec<(u64, std::path::PathBuf)> = Vec::new();
    for a in fs::read_dir(store.join("blobs")).unwrap() {
        for b in fs::read_dir(a.unwrap().path()).unwrap() {
            for e in fs::read_dir(b.unwrap().path()).unwrap() {
                let e = e.unwrap();
                blobs.push((e.metadata().unwrap().len(), e.path()));
            }
        }
    }
    blobs.into_iter().max().expect("a blob").1
}

/// One commit under two repos is one commit; a damaged blob is named with the models that use
/// it, once; `--repair` removes it through the store.
#[test]
fn verify_counts_commits_once_and_names_the_models_a_damage_hits() {
    let dir = tempfile::tempdir().unwrap();
    let (src, store, said) = imported_tiny(dir.path());
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
    let path = largest_blob(&store);
    let len = fs::metadata(&path).unwrap().len();
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
        lines[0].contains("local/one/f32") && lines[0].contains("local/two/f32"),
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

/// Makes a FIFO at `path` (as a mistaken `mkfifo` in the store would).
fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// A FIFO or a link to a device in a blob's place is damage that `verify` names and
/// `--repair` removes, without waiting forever to open or read it; `verify REF` of a bare
/// commit names the commit.
#[test]
fn verify_names_a_fifo_or_device_in_a_blobs_place_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let (src, store, said) = imported_tiny(dir.path());
    let commit = said
        .lines()
        .find_map(|l| l.split('@').nth(1)?.split(' ').next().map(str::to_owned))
        .unwrap();
    // The weights' chunk becomes a FIFO, the README's blob a link to /dev/zero.
    let blob_of = |bytes: &[u8]| store.join(tensorfs::format::ObjectRef::of(bytes).blob_path());
    let chunk = largest_blob(&store);
    let readme = blob_of(&fs::read(src.join("README.md")).unwrap());
    let (fifo, device) = (&chunk, &readme);
    fs::remove_file(fifo).unwrap();
    mkfifo(fifo);
    fs::remove_file(device).unwrap();
    std::os::unix::fs::symlink("/dev/zero", device).unwrap();

    let said = fails(&store, &["verify"]);
    assert_eq!(said.matches("damaged blob").count(), 2, "{said}");
    let said = fails(&store, &["verify", &commit]);
    assert!(said.contains(&format!("used by commit {commit}")), "{said}");
    let said = fails(&store, &["verify", "--repair"]);
    assert_eq!(said.matches("removed").count(), 2, "{said}");
    assert!(fs::symlink_metadata(fifo).is_err() && fs::symlink_metadata(device).is_err());
}

/// An upload whose local store is missing makes no store at its `file://` endpoint.
#[test]
fn a_failed_upload_leaves_no_store_at_its_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mirror = dir.path().join("mirror");
    let url = format!("file://{}", mirror.display());
    let said = fails(
        &dir.path().join("no-store"),
        &["upload", "local/x", "acme/x", "--endpoint", &url],
    );
    assert!(said.contains("not a store"), "{said}");
    assert!(!mirror.exists(), "no store was made at the endpoint");
}

/// An empty TENSORFS_ENDPOINT: no endpoint for `mount` (it mounts the store alone, here
/// refused as absent, not as a bad URL), and a clear error for `download`.
#[test]
fn an_empty_endpoint_variable_is_named_or_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let out = tensorfs()
        .args(["--store"])
        .arg(dir.path().join("absent"))
        .args(["download", "acme/x"])
        .env("TENSORFS_ENDPOINT", "")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("TENSORFS_ENDPOINT"), "{said}");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = tensorfs()
        .args(["--store"])
        .arg(dir.path().join("absent"))
        .arg("mount")
        .arg(&mnt)
        .env("TENSORFS_ENDPOINT", "")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("not a store"),
        "mounts the store alone: {said}"
    );
    assert!(!said.contains("URL"), "{said}");
}

/// Standard output that cannot be written (a full disk: /dev/full) is a one-line error and exit
/// status 1, whichever way the verb writes: `println!` (doctor) or a generator that panics on
/// a failed write (completions).
#[test]
fn an_unwritable_standard_output_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["completions", "bash"][..], &["doctor", "--json"]] {
        let out = tensorfs()
            .arg("--store")
            .arg(dir.path().join("store"))
            .args(args)
            .stdout(fs::File::options().write(true).open("/dev/full").unwrap())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {said}");
        assert!(
            said.contains("writing to standard output") && !said.contains("panicked"),
            "{args:?}: {said}"
        );
    }
}
