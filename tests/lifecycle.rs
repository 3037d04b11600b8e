//! The store's lifecycle: `rm` unreferences, `gc` collects by the reference's retention rules
//! (`store::retention`), mounts hold what their open files read, and either implementation's
//! collection keeps the other's live data.

mod common;
mod fuse_support;
mod skip;

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::*;
use tensorfs::store::Store;

/// Two models sharing a 20 MiB tensor (stored once) with a small tensor each.
fn two_models(dir: &Path, store: &Path) -> (PathBuf, PathBuf) {
    let big = bytes(20 << 20, 7);
    let file = |extra: u8, unique: usize| {
        safetensors_file(
            &[
                T(
                    "big.weight",
                    safetensors::Dtype::U8,
                    vec![20 << 20],
                    big.clone(),
                ),
                T(
                    "own.weight",
                    safetensors::Dtype::U8,
                    vec![unique],
                    bytes(unique, extra),
                ),
            ],
            None,
        )
    };
    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    fs::write(&a, file(1, 3 << 20)).unwrap();
    fs::write(&b, file(2, 1 << 20)).unwrap();
    for (path, name) in [(&a, "local/a"), (&b, "local/b")] {
        ok(store, &["import", path.to_str().unwrap(), "--name", name]);
    }
    (a, b)
}

/// Every blob of the store by digest, with its length.
fn blobs(store: &Path) -> BTreeSet<(String, u64)> {
    Store::open(store)
        .unwrap()
        .blobs()
        .unwrap()
        .into_iter()
        .map(|o| (o.sha256.to_string(), o.length))
        .collect()
}

/// The closure of every commit `name` names.
fn closure(store: &Path, name: &str) -> BTreeSet<(String, u64)> {
    let store = Store::open(store).unwrap();
    let repo = store.repo(name).unwrap().unwrap();
    repo.roots()
        .flat_map(|c| store.commit(c).unwrap().closure())
        .map(|o| (o.sha256.to_string(), o.length))
        .collect()
}

/// A one-tensor safetensors file at `path`, its 8 bytes from `seed`.
fn tiny(path: &Path, seed: u8) {
    let tensor = T("x", safetensors::Dtype::U8, vec![8], bytes(8, seed));
    fs::write(path, safetensors_file(&[tensor], None)).unwrap();
}

fn gc(store: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["gc", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(store, &all)).unwrap()
}

#[test]
fn rm_and_gc_free_exactly_a_models_unique_bytes_and_the_sharing_model_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (_, b) = two_models(dir.path(), &store);
    let (of_a, of_b) = (closure(&store, "local/a"), closure(&store, "local/b"));
    let unique: BTreeSet<_> = of_a.difference(&of_b).cloned().collect();
    assert!(
        of_a.intersection(&of_b).any(|(_, len)| *len >= 20 << 20),
        "the models share their big chunk"
    );
    let before = blobs(&store);

    // `du` says what only local/a holds: what rm + gc will free.
    let du: serde_json::Value = serde_json::from_str(&ok(&store, &["du", "--json"])).unwrap();
    let row = |name: &str| {
        du["repos"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["repo"] == name)
            .unwrap_or_else(|| panic!("no {name} in {du}"))
            .clone()
    };
    let unique_bytes: u64 = unique.iter().map(|(_, len)| len).sum();
    assert_eq!(row("local/a")["unique"], unique_bytes, "{du}");
    assert_eq!(
        row("local/a")["shared"],
        of_a.intersection(&of_b).map(|(_, len)| len).sum::<u64>(),
        "{du}"
    );
    assert_eq!(row("local/a")["kept_by"], "root (local/)");
    let total = &du["total"];
    assert_eq!(total["unnamed"], 0, "{du}");
    assert!(total["dedup_ratio"].as_f64().unwrap() > 1.5, "{du}");
    // Nothing unreferenced: a collection removes nothing, even with no grace.
    assert_eq!(gc(&store, &["--grace", "0"])["removed_bytes"], 0);
    let dry = ok(&store, &["rm", "local/a", "--dry-run"]);
    assert!(dry.contains("would remove repo local/a"), "{dry}");
    assert!(ok(&store, &["ls"]).contains("local/a"));
    let said = ok(&store, &["rm", "local/a"]);
    assert!(said.contains("removed repo local/a"), "{said}");
    assert!(!ok(&store, &["ls"]).contains("local/a"));
    // Young objects stay for the grace (an import may be about to name them).
    assert_eq!(gc(&store, &[])["removed_bytes"], 0);
    let dry = gc(&store, &["--grace", "0", "--dry-run"]);
    assert_eq!(blobs(&store), before, "a dry run removes nothing");
    let done = gc(&store, &["--grace", "0"]);
    assert_eq!(
        done["removed"], dry["removed"],
        "the dry run said what goes"
    );
    let freed: u64 = unique.iter().map(|(_, len)| len).sum();
    assert_eq!(done["removed_bytes"], freed, "{done}");
    assert_eq!(
        before
            .difference(&blobs(&store))
            .cloned()
            .collect::<BTreeSet<_>>(),
        unique,
        "exactly the objects only local/a had"
    );
    ok(&store, &["verify"]);
    let out = dir.path().join("out");
    ok(&store, &["export", "local/b", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("b.safetensors")).unwrap(),
        fs::read(&b).unwrap()
    );
}

#[test]
fn rm_refuses_what_it_cannot_take_out_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    two_models(dir.path(), &store);
    let before = snapshot(&store);
    let err = fails(&store, &["rm", "local/absent"]);
    assert!(err.contains("no repo \"local/absent\""), "{err}");
    let err = fails(&store, &["rm", "local/a@latest"]);
    assert!(
        err.contains("`latest` is not a revision of its own"),
        "{err}"
    );
    let err = fails(&store, &["rm", "local/a@9.9"]);
    assert!(err.contains("has no release \"9.9\""), "{err}");
    let err = fails(&store, &["rm", &format!("local/a@{}", "0".repeat(64))]);
    assert!(err.contains("names no commit"), "{err}");
    // A local repo has no releases: the refusal says how to name one lane.
    let err = fails(&store, &["rm", "local/a", "--lane", "f32"]);
    assert!(
        err.contains("local/a@<commit>") && err.contains("tensorfs inspect local/a"),
        "{err}"
    );
    assert_eq!(snapshot(&store), before, "a refused rm changes nothing");
}

#[test]
fn an_open_file_of_a_removed_model_reads_through_a_collection_and_is_freed_once_closed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (a, _) = two_models(dir.path(), &root);
    let unique: u64 = closure(&root, "local/a")
        .difference(&closure(&root, "local/b"))
        .map(|(_, len)| len)
        .sum();
    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);
    let lane = fuse_support::list(&m.path("local/a/latest")).remove(0);
    let path = m.path(&format!("local/a/latest/{lane}/a.safetensors"));
    let mut file = fs::File::open(&path).unwrap();
    let mut head = vec![0u8; 4096];
    file.read_exact(&mut head).unwrap();
    fuse_support::drop_cached_pages(&path);
    ok(&root, &["rm", "local/a"]);
    fuse_support::wait_for(
        || !m.path("local").join("a").exists(),
        "the removed repo to leave the listing",
    );
    let held = gc(&root, &["--grace", "0"]);
    assert_eq!(
        held["removed_bytes"], 0,
        "an open file's objects are held: {held}"
    );
    assert!(held["live_holds"].as_u64().unwrap() >= 1, "{held}");
    let mut rest = Vec::new();
    file.read_to_end(&mut rest).unwrap();
    head.extend(rest);
    assert_eq!(head, fs::read(&a).unwrap(), "the open file reads whole");
    drop(file);
    // Closed (the kernel says so a moment later), all of it goes while still mounted: the
    // mount closes the blobs it kept open for the file.
    let mut freed = 0;
    fuse_support::wait_for(
        || {
            freed += gc(&root, &["--grace", "0"])["removed_bytes"]
                .as_u64()
                .unwrap();
            freed == unique
        },
        "the closed file's objects to be freed",
    );
    ok(&root, &["verify"]);
    m.unmount();
}

/// A view's build reads the holes the file's reads left after the reads pause, which is often
/// after the file's last close: the daemon kept those blobs open (a shared lock each), and a
/// collection left them "open by readers" for as long as the mount ran.
#[test]
fn a_model_whose_file_got_a_view_is_freed_once_closed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    // Two chunks: the view starts after an eighth of the file is served, and the build reads
    // that part again from the first chunk.
    let a = dir.path().join("a.safetensors");
    let tensors = [
        T(
            "a.weight",
            safetensors::Dtype::U8,
            vec![4000],
            bytes(4000, 3),
        ),
        T(
            "b.weight",
            safetensors::Dtype::U8,
            vec![80 << 20],
            bytes(80 << 20, 4),
        ),
    ];
    fs::write(&a, safetensors_file(&tensors, None)).unwrap();
    ok(&root, &["import", a.to_str().unwrap(), "--name", "local/a"]);
    let unique: u64 = closure(&root, "local/a").iter().map(|(_, len)| len).sum();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let views = dir.path().join("views");
    mount_background(
        &root,
        &mnt,
        &dir.path().join("mount.log"),
        &["--view-cache", "1G", "--view-dir", views.to_str().unwrap()],
    );
    let _unmount = Unmount(mnt.clone());
    let lane = fuse_support::list(&mnt.join("local/a/latest")).remove(0);
    let path = mnt.join(format!("local/a/latest/{lane}/a.safetensors"));
    fs::read(&path).unwrap();
    fuse_support::wait_for(
        || fuse_support::xattr(&path, "user.tensorfs.view").as_deref() == Some(b"ready"),
        "the file's view",
    );
    ok(&root, &["rm", "local/a"]);
    let mut freed = 0;
    fuse_support::wait_for(
        || {
            let report = gc(&root, &["--grace", "0"]);
            freed += report["removed_bytes"].as_u64().unwrap();
            freed == unique
        },
        "the model's objects to be freed while the mount runs",
    );
    ok(&root, &["unmount", mnt.to_str().unwrap()]);
}

#[test]
fn a_collection_killed_at_any_point_leaves_every_ref_complete_and_the_next_one_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // Many objects to sweep: a model of many small chunks, removed.
    let tensors: Vec<T> = (0..400)
        .map(|i| {
            T(
                Box::leak(format!("layer.{i}.weight").into_boxed_str()),
                safetensors::Dtype::U8,
                vec![70 << 10],
                bytes(70 << 10, i as u8),
            )
        })
        .collect();
    let many = dir.path().join("many.safetensors");
    fs::write(&many, safetensors_file(&tensors, None)).unwrap();
    let (_, b) = two_models(dir.path(), &store);
    for round in 0..4 {
        ok(
            &store,
            &["import", many.to_str().unwrap(), "--name", "local/many"],
        );
        ok(&store, &["rm", "local/many"]);
        let mut child = tensorfs()
            .args(["--store", store.to_str().unwrap(), "gc", "--grace", "0"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(5 + 15 * round));
        let _ = child.kill();
        let _ = child.wait();
        ok(&store, &["verify"]);
        let next = gc(&store, &["--grace", "0"]);
        assert!(!next["skipped"].as_bool().unwrap(), "{next}");
        assert!(
            !store.join("tmp/gc").exists(),
            "the next collection finishes"
        );
        ok(&store, &["verify"]);
    }
    let out = dir.path().join("out");
    ok(&store, &["export", "local/b", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("b.safetensors")).unwrap(),
        fs::read(&b).unwrap()
    );
}

/// A use past the TTL (by a clock moved on) is dropped, and what only it kept goes.
#[test]
fn a_use_expires_a_week_after_its_last_use() {
    use tensorfs::store::retention::Collect;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    two_models(dir.path(), &root);
    let store = Store::open(&root).unwrap();
    // A cached commit: named by a repo outside local/ and kept by its use alone, as a
    // download or a lazy mount leaves it.
    let repo = store.repo("local/a").unwrap().unwrap();
    let commit = *repo.roots().next().unwrap();
    store
        .update_repo("acme/a", |_| tensorfs::format::Repo {
            name: "acme/a".into(),
            releases: vec![],
            commits: vec![commit],
        })
        .unwrap();
    fs::remove_file(store.ref_path("local/a").unwrap()).unwrap();
    let at = |days: u64| Collect {
        grace: Duration::ZERO,
        now: SystemTime::now() + Duration::from_secs(days * 24 * 3600),
        ..Collect::default()
    };
    let kept = store.collect(&at(6)).unwrap();
    assert!(kept.removed.is_empty(), "{kept:?}");
    assert!(
        store.commit(&commit).is_ok(),
        "a use keeps it within the week"
    );
    let gone = store.collect(&at(8)).unwrap();
    assert_eq!(gone.dropped_uses, vec![commit.sha256]);
    assert!(gone.removed.contains(&commit), "{gone:?}");
    // Evicted, it leaves its repo, which named nothing else: no listing shows what is gone.
    assert_eq!(gone.evicted, vec![format!("acme/a@{}", commit.id())]);
    assert!(store.repo("acme/a").unwrap().is_none());
    assert!(!ok(&root, &["ls"]).contains("acme/a"));
    assert!(store
        .commit(
            &store
                .repo("local/b")
                .unwrap()
                .unwrap()
                .roots()
                .next()
                .copied()
                .unwrap()
        )
        .is_ok());
}

// ---- With the reference --------------------------------------------------------------

/// The reference `tfs` beside `TENSORFS_TEST_PYTHON`.
fn reference_tfs() -> Option<PathBuf> {
    let python = PathBuf::from(std::env::var_os("TENSORFS_TEST_PYTHON")?);
    let tfs = python.parent()?.join("tfs");
    tfs.is_file().then_some(tfs)
}

fn tfs(tfs: &Path, store: &Path, args: &[&str]) -> String {
    let out = Command::new(tfs)
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("tfs runs");
    assert!(
        out.status.success(),
        "tfs {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes the reference collect at its next write: every object and use a week and a day old,
/// and its sweep throttle (`uses/.swept`) gone.
fn due(store: &Path) {
    let week = Duration::from_secs(8 * 24 * 3600);
    age(&store.join("blobs"), week);
    age(&store.join("uses"), week);
    let _ = fs::remove_file(store.join("uses/.swept"));
}

#[test]
fn the_references_collection_keeps_our_refs_and_what_our_mount_holds_open() {
    let Some(reference) = reference_tfs() else {
        skip::missing("the reference `tfs` beside TENSORFS_TEST_PYTHON");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (a, b) = two_models(dir.path(), &root);
    let only_a: Vec<PathBuf> = closure(&root, "local/a")
        .difference(&closure(&root, "local/b"))
        .map(|(hex, _)| root.join(format!("blobs/{}/{}/{hex}", &hex[..2], &hex[2..4])))
        .collect();
    let store = Store::open(&root).unwrap();
    let m = fuse_support::mount(&store);
    let lane = fuse_support::list(&m.path("local/a/latest")).remove(0);
    let path = m.path(&format!("local/a/latest/{lane}/a.safetensors"));
    let mut file = fs::File::open(&path).unwrap();
    fuse_support::drop_cached_pages(&path);
    // local/a is no root any more: only the mount's hold keeps it.
    ok(&root, &["rm", "local/a"]);
    due(&root);
    let other = dir.path().join("other.safetensors");
    tiny(&other, 9);
    tfs(&reference, &root, &["import", other.to_str().unwrap()]);
    assert!(root.join("uses/.swept").exists(), "the reference collected");
    assert!(
        only_a.iter().all(|p| p.exists()),
        "the hold kept local/a's objects"
    );
    let mut read = Vec::new();
    file.read_to_end(&mut read).unwrap();
    assert_eq!(read, fs::read(&a).unwrap(), "the held file reads whole");
    ok(&root, &["verify"]);
    let out = dir.path().join("out");
    ok(&root, &["export", "local/b", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("b.safetensors")).unwrap(),
        fs::read(&b).unwrap()
    );
    // Closed and unmounted (the daemon keeps blobs open, under a shared flock, while
    // mounted), nothing holds local/a: the reference's next collection frees it.
    drop(file);
    m.unmount();
    due(&root);
    // New bytes: an import of what is there already admits nothing, and collects not.
    tiny(&other, 11);
    tfs(&reference, &root, &["import", other.to_str().unwrap()]);
    let left: Vec<_> = only_a.iter().filter(|p| p.exists()).collect();
    let listing = |dir: &str| -> Vec<String> {
        fs::read_dir(root.join(dir))
            .unwrap()
            .flatten()
            .map(|e| {
                format!(
                    "{:?}: {:?}",
                    e.file_name(),
                    fs::read_to_string(e.path()).unwrap_or_default()
                )
            })
            .collect()
    };
    assert!(
        left.is_empty(),
        "the reference collected what nothing holds: {left:?}\nholds {:?}\nuses {:?}",
        listing("holds"),
        listing("uses")
    );
    ok(&root, &["verify"]);
}

#[test]
fn our_collection_keeps_what_the_reference_keeps_in_a_store_it_wrote() {
    let Some(reference) = reference_tfs() else {
        skip::missing("the reference `tfs` beside TENSORFS_TEST_PYTHON");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let src = dir.path().join("src");
    transformers_folder(&src);
    tfs(
        &reference,
        &root,
        &["import", src.to_str().unwrap(), "--name", "local/theirs"],
    );
    let unnamed = dir.path().join("cached.safetensors");
    tiny(&unnamed, 3);
    // Imported without a name: the reference keeps it by its uses alone.
    tfs(&reference, &root, &["import", unnamed.to_str().unwrap()]);
    let before = blobs(&root);
    let done = gc(&root, &["--grace", "0"]);
    assert_eq!(done["removed_bytes"], 0, "{done}");
    assert_eq!(blobs(&root), before);
    tfs(&reference, &root, &["verify", "local/theirs"]);
    ok(&root, &["verify"]);
}

/// Retention touches blobs (the reference renews the grace of every blob it reuses): the
/// mount's mtimes come from when the tree blob was made, so they do not move, and page caches
/// and ComfyUI's mtime-keyed listings are not disturbed.
#[test]
fn mount_mtimes_do_not_move_when_retention_touches_blobs() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    if fs::metadata(dir.path()).and_then(|m| m.created()).is_err() {
        skip::missing("birth times (statx btime) on the test filesystem");
        return;
    }
    let root = dir.path().join("store");
    two_models(dir.path(), &root);
    let store = Store::open(&root).unwrap();
    let stamps = || {
        let m = fuse_support::mount(&store);
        let lane = fuse_support::list(&m.path("local/a/latest")).remove(0);
        let folder = m.path(&format!("local/a/latest/{lane}"));
        let stamp = |p: &Path| {
            let meta = fs::metadata(p).unwrap();
            (meta.mtime(), meta.mtime_nsec())
        };
        let out = (stamp(&folder), stamp(&folder.join("a.safetensors")));
        m.unmount();
        out
    };
    let before = stamps();
    std::thread::sleep(Duration::from_millis(20));
    let now = SystemTime::now();
    for o in store.blobs().unwrap() {
        fs::File::open(store.object_path(&o))
            .unwrap()
            .set_modified(now)
            .unwrap();
    }
    gc(&root, &["--grace", "0"]);
    assert_eq!(stamps(), before);
}

/// A small tmpfs mounted at `at` for the test's life.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, mib: u64) -> SmallDisk {
        SmallDisk::mount_with(at, &format!("size={mib}m"))
    }

    /// A tmpfs with `options` (`size=…`, `nr_inodes=…`).
    fn mount_with(at: &Path, options: &str) -> SmallDisk {
        fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(at.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A store on a tmpfs of 1200 MiB (its reserve is the 1 GiB minimum) under `dir`; `None`, the
/// test skipped, when not root.
fn store_on_a_small_disk(dir: &Path) -> Option<(SmallDisk, PathBuf)> {
    if unsafe { libc::geteuid() } != 0 {
        skip::missing("root, to mount a small tmpfs for the store");
        return None;
    }
    let disk = SmallDisk::mount(&dir.join("disk"), 1200);
    let root = disk.0.join("store");
    Some((disk, root))
}

/// A file of `count` U8 tensors of `mib` MiB each, seeded by `seed`.
fn weights_of(path: &Path, count: usize, mib: usize, seed: u8) {
    let tensors: Vec<T> = (0..count)
        .map(|i| {
            T(
                Box::leak(format!("layer.{i}.weight").into_boxed_str()),
                safetensors::Dtype::U8,
                vec![mib << 20],
                bytes(mib << 20, seed.wrapping_add(i as u8)),
            )
        })
        .collect();
    fs::write(path, safetensors_file(&tensors, None)).unwrap();
}

/// The disk's reserve (2 % of it, at least 1 GiB) is kept: an import that would cross it
/// first evicts what only uses keep, then, with nothing left to evict, is refused whole.
#[test]
fn an_import_that_would_cross_the_reserve_evicts_cache_first_then_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_disk, root)) = store_on_a_small_disk(dir.path()) else {
        return;
    };
    // A cached model: 100 MiB that only its use keeps, last written two hours ago.
    let cached = dir.path().join("cached.safetensors");
    weights_of(&cached, 2, 50, 1);
    ok(
        &root,
        &["import", cached.to_str().unwrap(), "--name", "local/cached"],
    );
    let store = Store::open(&root).unwrap();
    fs::remove_file(store.ref_path("local/cached").unwrap()).unwrap();
    age(&root.join("blobs"), Duration::from_secs(2 * 3600));
    // 150 MiB fits only once the cache is gone (1200 − 100 − 150 < the 1 GiB reserve).
    let fits = dir.path().join("fits.safetensors");
    weights_of(&fits, 3, 50, 7);
    ok(
        &root,
        &["import", fits.to_str().unwrap(), "--name", "local/fits"],
    );
    let du: serde_json::Value = serde_json::from_str(&ok(&root, &["du", "--json"])).unwrap();
    assert_eq!(du["total"]["unnamed"], 0, "the cache was evicted: {du}");
    // 400 MiB does not fit, with nothing left to evict: refused, the store as it was.
    let before = snapshot(&root);
    let big = dir.path().join("big.safetensors");
    weights_of(&big, 8, 50, 3);
    let err = fails(
        &root,
        &["import", big.to_str().unwrap(), "--name", "local/big"],
    );
    assert!(
        err.contains("no space") && err.contains("reserve of 1.00 GiB"),
        "{err}"
    );
    assert_eq!(
        snapshot(&root),
        before,
        "a refused import leaves the store as it was"
    );
    ok(&root, &["verify"]);
}

/// A collection never takes what a running import has staged: the import's temp files are
/// young or not, and `gc --grace 0` runs over and over while it writes.
#[test]
fn collections_during_an_import_leave_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let seed = dir.path().join("seed.safetensors");
    tiny(&seed, 1);
    ok(
        &store,
        &["import", seed.to_str().unwrap(), "--name", "local/seed"],
    );
    let src = dir.path().join("big.safetensors");
    weights_of(&src, 12, 16, 5);
    let mut import = tensorfs()
        .args(["--store", store.to_str().unwrap(), "import"])
        .arg(&src)
        .args(["--name", "local/big"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut collections = 0;
    let status = loop {
        if let Some(status) = import.try_wait().unwrap() {
            break status;
        }
        gc(&store, &["--grace", "0"]);
        collections += 1;
    };
    let mut said = String::new();
    import
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert!(
        status.success(),
        "the import failed after {collections} collections: {said}"
    );
    assert!(collections > 0, "no collection ran during the import");
    ok(&store, &["verify"]);
    let out = dir.path().join("out");
    ok(&store, &["export", "local/big", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("big.safetensors")).unwrap(),
        fs::read(&src).unwrap()
    );
}

/// Taking out a lane's newest commit makes `latest` show the older one: rm says so.
#[test]
fn rm_of_a_newest_commit_says_what_latest_falls_back_to() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (v1, v2) = (
        dir.path().join("v1/x.safetensors"),
        dir.path().join("v2/x.safetensors"),
    );
    for (path, seed) in [(&v1, 1), (&v2, 2)] {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        tiny(path, seed);
    }
    let first = commits(&ok(
        &store,
        &["import", v1.to_str().unwrap(), "--name", "local/x"],
    ));
    let second = commits(&ok(
        &store,
        &["import", v2.to_str().unwrap(), "--name", "local/x"],
    ));
    let said = ok(&store, &["rm", &format!("local/x@{}", second[0])]);
    assert!(
        said.contains(&format!(
            "local/x/latest/u8 now shows the older {}",
            first[0]
        )),
        "{said}"
    );
    let out = dir.path().join("out");
    ok(&store, &["export", "local/x", out.to_str().unwrap()]);
    assert_eq!(
        fs::read(out.join("x.safetensors")).unwrap(),
        fs::read(&v1).unwrap()
    );
}

/// A `local/` repo's commit whose documents cannot be read stops the collection before
/// anything is removed: what it keeps is unknown.
#[test]
fn gc_stops_on_a_local_commit_it_cannot_read_and_removes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    two_models(dir.path(), &root);
    ok(&root, &["rm", "local/b"]);
    let store = Store::open(&root).unwrap();
    let commit = *store
        .repo("local/a")
        .unwrap()
        .unwrap()
        .roots()
        .next()
        .unwrap();
    fs::remove_file(store.object_path(&commit)).unwrap();
    let before = blobs(&root);
    let err = fails(&root, &["gc", "--grace", "0"]);
    assert!(
        err.contains("local/a names commit") && err.contains("nothing was collected"),
        "{err}"
    );
    assert_eq!(blobs(&root), before, "nothing removed");
}

/// A disk with no block and no inode left: `tmp/gc/` cannot be made, yet the collection is
/// what frees space, so it removes in place.
#[test]
fn gc_on_a_full_disk_frees_what_nothing_keeps() {
    if unsafe { libc::geteuid() } != 0 {
        skip::missing("root, to mount a small tmpfs for the store");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = SmallDisk::mount_with(&dir.path().join("disk"), "size=4m,nr_inodes=64");
    let disk = small.0.clone();
    let root = disk.join("store");
    let store = Store::open(&root).unwrap();
    // An object nothing names, past the grace.
    let garbage = store.put_bytes(&bytes(1 << 20, 3)).unwrap();
    drop(store.fence().unwrap());
    age(&root.join("blobs"), Duration::from_secs(7200));
    // Every inode, then every block, taken.
    let mut n = 0;
    while fs::File::create(disk.join(format!("f{n}"))).is_ok() {
        n += 1;
    }
    let mut fill = fs::OpenOptions::new()
        .append(true)
        .open(disk.join("f0"))
        .unwrap();
    while std::io::Write::write_all(&mut fill, &[0u8; 4096]).is_ok() {}
    assert!(
        fs::create_dir(root.join("tmp/probe")).is_err(),
        "the disk is full"
    );

    // The object's temp file was written here, where other tests spawn processes: a child
    // forked while its descriptor was open holds the descriptor's shared lock until it execs,
    // and a collection rightly keeps what is locked ("busy"). Collect until nothing is.
    let mut report = gc(&root, &["--grace", "1h"]);
    for _ in 0..50 {
        if report["busy"] == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        report = gc(&root, &["--grace", "1h"]);
    }
    assert_eq!(report["removed"].as_array().unwrap().len(), 1, "{report}");
    assert!(!store.contains(&garbage));
    ok(&root, &["verify"]);
}

/// Views in the store's `views/` are counted by `du` and dropped, before any cache, when a
/// write would cross the reserve.
#[test]
fn views_are_counted_and_dropped_first_when_space_is_short() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_disk, root)) = store_on_a_small_disk(dir.path()) else {
        return;
    };
    Store::open(&root).unwrap();
    // A view of 100 MiB, as a mount with --view-cache leaves one.
    let views = root.join("views");
    fs::create_dir(&views).unwrap();
    fs::write(views.join(".tensorfs-views"), b"").unwrap();
    let view = views.join("ab".repeat(32));
    fs::write(&view, vec![7u8; 100 << 20]).unwrap();
    let du: serde_json::Value = serde_json::from_str(&ok(&root, &["du", "--json"])).unwrap();
    assert_eq!(du["total"]["views"], 1, "{du}");
    assert_eq!(du["total"]["views_bytes"], 100 << 20, "{du}");
    // 150 MiB fits only once the view is gone (1200 − 100 − 150 < the 1 GiB reserve).
    let fits = dir.path().join("fits.safetensors");
    weights_of(&fits, 3, 50, 7);
    ok(
        &root,
        &["import", fits.to_str().unwrap(), "--name", "local/fits"],
    );
    assert!(!view.exists(), "the view made room");
    assert!(views.join(".tensorfs-views").exists());
    ok(&root, &["verify"]);
}
