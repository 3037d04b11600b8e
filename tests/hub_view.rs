//! The hub cache view `MOUNT/@hf` on real mounts: its layout as huggingface_hub reads it, the
//! lane files' own inodes, refs, and following imports while mounted.

mod common;
mod fuse_support;
mod skip;

use std::fs;
use std::os::unix::fs::MetadataExt;

use tensorfs::store::Store;

const REV: &str = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";

fn is_hex40(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[test]
fn the_hub_view_shows_each_repo_as_huggingface_hub_lays_out_a_cache() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    common::transformers_folder(&src);
    let root = dir.path().join("store");
    let src_arg = src.to_str().unwrap();
    let import_as = |rev: &str| {
        let hf_id = format!("acme/tiny-bert@{rev}");
        let args = ["import", src_arg, "--name", "local/bert", "--hf-id", &hf_id];
        common::ok(&root, &args)
    };
    let hub = import_as(REV);
    let ours = common::commits(&hub);
    assert_eq!(ours.len(), 1, "{hub}");
    let plain = common::ok(&root, &["import", src_arg, "--name", "local/plain"]);
    let plain_commit = common::commits(&plain).remove(0);
    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);

    let top = fuse_support::list(&m.path(""));
    assert!(
        top.contains(&"@hf".to_owned()) && top.contains(&"local".to_owned()),
        "{top:?}"
    );
    assert_eq!(
        fuse_support::list(&m.path("@hf")),
        ["models--acme--tiny-bert", "models--local--plain"],
        "a repo with a hub id shows under it, one without under its own name"
    );
    let repo = m.path("@hf/models--acme--tiny-bert");
    assert_eq!(
        fuse_support::list(&repo),
        ["refs", "snapshots"],
        "no listing was recorded"
    );
    // refs/<ref> is a bare hash with no newline; our commit id names the snapshot too.
    assert_eq!(fs::read_to_string(repo.join("refs/main")).unwrap(), REV);
    let hex = ours[0].strip_prefix("sha256:").unwrap();
    assert_eq!(
        fs::read_to_string(repo.join("refs").join(hex)).unwrap(),
        REV
    );
    assert_eq!(fuse_support::list(&repo.join("snapshots")), [REV]);
    let snapshot = repo.join("snapshots").join(REV);
    let lane = fuse_support::list(&m.path("local/bert/latest")).remove(0);
    let lane_dir = m.path("local/bert/latest").join(&lane);
    assert_eq!(
        fuse_support::list(&snapshot),
        fuse_support::list(&lane_dir),
        "the snapshot holds the lane's files"
    );
    for file in ["config.json", "model.safetensors", "1_Pooling/config.json"] {
        let (a, b) = (snapshot.join(file), lane_dir.join(file));
        assert_eq!(
            fs::read(&a).unwrap(),
            fs::read(src.join(file)).unwrap(),
            "{file}"
        );
        assert_eq!(
            fs::metadata(&a).unwrap().ino(),
            fs::metadata(&b).unwrap().ino(),
            "{file}: one inode (and one page cache) for both views"
        );
    }
    // A repo without a hub commit gets a stable 40-hex snapshot name that refs/main names.
    let plain_repo = m.path("@hf/models--local--plain");
    let main = fs::read_to_string(plain_repo.join("refs/main")).unwrap();
    assert!(is_hex40(&main), "{main:?}");
    assert_eq!(
        fuse_support::list(&plain_repo.join("snapshots")),
        std::slice::from_ref(&main)
    );
    let hex = plain_commit.strip_prefix("sha256:").unwrap();
    assert_eq!(
        fs::read_to_string(plain_repo.join("refs").join(hex)).unwrap(),
        main
    );
    // Read-only, like every other folder of the mount.
    assert_eq!(
        fuse_support::errno(fs::create_dir(repo.join("blobs"))),
        libc::EROFS
    );
    assert_eq!(
        fuse_support::errno(fs::write(snapshot.join("new.json"), b"{}")),
        libc::EROFS
    );

    // The view follows imports while mounted: a new revision moves refs/main.
    let newer = "0123456789abcdef0123456789abcdef01234567";
    fs::write(src.join("README.md"), "# newer\n").unwrap();
    import_as(newer);
    fuse_support::wait_for(
        || fs::read_to_string(repo.join("refs/main")).is_ok_and(|r| r == newer),
        "refs/main to name the new revision",
    );
    let mut both = vec![REV.to_owned(), newer.to_owned()];
    both.sort();
    assert_eq!(fuse_support::list(&repo.join("snapshots")), both);
    assert_eq!(
        fs::read(repo.join("snapshots").join(newer).join("README.md")).unwrap(),
        b"# newer\n"
    );
    assert_eq!(
        fs::read(snapshot.join("README.md")).unwrap(),
        b"# tiny\n",
        "an older snapshot keeps its files"
    );
    m.unmount();
}

/// The view's refs are the hub cache's: `main` stays where the cache's main is when an older
/// tag is downloaded later, and a ref added to a snapshot already imported shows up. A blob
/// removed by `verify --repair` is imported again, and a local repo of the same name holding
/// other models is not taken over.
#[test]
fn the_hub_views_refs_follow_the_cache_and_imports_repair_the_store() {
    let Some(python) = std::env::var_os("TENSORFS_TEST_PYTHON") else {
        skip::missing("TENSORFS_TEST_PYTHON is not set (a venv with huggingface_hub)");
        return;
    };
    let python = std::path::Path::new(&python);
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    common::transformers_folder(&one);
    common::transformers_folder(&two);
    fs::write(two.join("README.md"), "# an older tag\n").unwrap();
    let cache = dir.path().join("cache");
    let root = dir.path().join("store");
    let cache_arg = cache.to_str().unwrap();
    let main = common::hub_cache(python, &one, "acme/r", "main", &cache)["commit"]
        .as_str()
        .unwrap()
        .to_owned();
    common::ok(&root, &["import", "--hf-cache", cache_arg]);
    let tag = common::hub_cache(python, &two, "acme/r", "v0.9", &cache)["commit"]
        .as_str()
        .unwrap()
        .to_owned();
    common::ok(&root, &["import", "--hf-cache", cache_arg]);
    // The same commit under one more ref: up to date, its refs recorded anew.
    common::hub_cache(python, &one, "acme/r", "v1.0", &cache);
    let said = common::ok(&root, &["import", "--hf-cache", cache_arg]);
    assert!(said.contains("2 up to date"), "{said}");

    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);
    let refs = m.path("@hf/models--acme--r/refs");
    let read = |name: &str| fs::read_to_string(refs.join(name)).unwrap();
    assert_eq!(
        read("main"),
        main,
        "the cache's main, not the newest import"
    );
    assert_eq!(read("v0.9"), tag);
    assert_eq!(read("v1.0"), main);
    m.unmount();

    // A chunk blob lost (as `verify --repair` leaves the store): the next run imports the
    // snapshot again instead of finding it up to date.
    let weights = std::path::Path::new(&root).join("blobs");
    let mut biggest = None;
    for entry in walkdir(&weights) {
        let len = fs::metadata(&entry).unwrap().len();
        if biggest.as_ref().is_none_or(|(l, _)| len > *l) {
            biggest = Some((len, entry));
        }
    }
    fs::remove_file(biggest.unwrap().1).unwrap();
    common::fails(&root, &["verify"]);
    let said = common::ok(&root, &["import", "--hf-cache", cache_arg]);
    assert!(said.contains("1 imported"), "{said}");
    common::ok(&root, &["verify"]);

    // local/solo holds another model: the hub repo `solo` is not added to it.
    let other = dir.path().join("other");
    common::transformers_folder(&other);
    fs::write(other.join("README.md"), "# mine\n").unwrap();
    common::ok(
        &root,
        &["import", other.to_str().unwrap(), "--name", "local/solo"],
    );
    common::hub_cache(python, &one, "solo", "main", &cache);
    let out = common::run(&root, &["import", "--hf-cache", cache_arg]);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(
        errors.contains("skipped solo@")
            && errors.contains("local/solo already holds models that are not hub repo solo"),
        "{errors}"
    );
    assert!(!common::ok(&root, &["ls"]).contains("hub solo"));
}

/// Every file under `dir`.
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// A quantized lane beside the original never stands in for it: huggingface_hub finds
/// `model.safetensors` in the snapshot, and it must be the original's bytes, not the encoded
/// lane's raw parts (which Transformers loads as wrong weights). A repo whose only lane is
/// encoded shows its decoded view.
#[test]
fn an_encoded_lane_never_shadows_the_original_in_a_snapshot() {
    use safetensors::Dtype::F32;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let floats: Vec<u8> = (0..64 * 256)
        .flat_map(|i| ((i as f32) * 0.013).sin().to_le_bytes())
        .collect();
    let weights = common::safetensors_file(
        &[
            common::T("dense.weight", F32, vec![64, 256], floats),
            common::T("dense.bias", F32, vec![64], vec![0; 256]),
        ],
        Some(&[("format", "pt")]),
    );
    common::write_tree(
        &src,
        &[
            ("config.json", b"{\"hidden_size\": 256}\n".to_vec()),
            ("model.safetensors", weights.clone()),
        ],
    );
    let root = dir.path().join("store");
    let src_arg = src.to_str().unwrap();
    common::ok(&root, &["import", src_arg, "--name", "local/q"]);
    for name in ["local/q8", "local/q"] {
        let args = [
            "quantize",
            "local/q",
            "--scheme",
            "int8.rowwise",
            "--name",
            name,
        ];
        common::ok(&root, &args);
    }
    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);
    assert_eq!(
        fuse_support::list(&m.path("local/q/latest")).len(),
        3,
        "f32, int8 and @decoded"
    );

    let snapshot = |repo: &str| {
        let folder = m.path("@hf").join(format!("models--local--{repo}"));
        let main = fs::read_to_string(folder.join("refs/main")).unwrap();
        folder.join("snapshots").join(main)
    };
    // (Compared without printing the files when they differ.)
    assert!(
        fs::read(snapshot("q").join("model.safetensors")).unwrap() == weights,
        "the original's bytes, not the quantized lane's"
    );
    let decoded = m.path("local/q8/latest/int8.rowwise@decoded/model.safetensors");
    assert!(
        fs::read(snapshot("q8").join("model.safetensors")).unwrap() == fs::read(decoded).unwrap(),
        "an encoded lane alone shows decoded"
    );
    m.unmount();
}
