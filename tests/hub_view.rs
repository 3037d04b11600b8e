//! The hub cache view `MOUNT/@hf` on real mounts: its layout as huggingface_hub reads it, the
//! lane files' own inodes, refs, and following imports while mounted.

mod common;
mod fuse_support;

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
