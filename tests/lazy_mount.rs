//! The lazy mount over `tensorfs serve` on loopback (real FUSE mounts, each in a guard that
//! unmounts on drop): the endpoint's models listed without their weights, a component read
//! fetching only its chunks, one fetch however many readers wait, and the fetched files served
//! offline by a later mount without the endpoint.

mod common;
mod fuse_support;
#[path = "common/http.rs"]
mod http;
#[path = "common/origin.rs"]
mod origin;
#[path = "common/proxy.rs"]
mod proxy;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use fuse_support::{errno, lazy_mount, list, mount, mount_with};
use origin::{store_is_clean, Origin, Size};
use proxy::{Fault, Rule};
use tensorfs::lazy::LazyConfig;
use tensorfs::store::Store;

#[test]
fn the_endpoints_models_list_and_one_component_fetches_only_its_chunks() {
    let origin = Origin::start("lazy", 1, Size::Large);
    let local = origin.local_store("local");
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(30));

    assert_eq!(list(&m.root), ["@comfyui", "@hf", "acme"]);
    assert_eq!(list(&m.path("acme")), ["lazy"]);
    let mut revisions = vec![
        "1.0".to_owned(),
        "latest".to_owned(),
        origin.commit.sha256.hex(),
    ];
    revisions.sort();
    assert_eq!(list(&m.path("acme/lazy")), revisions);
    assert_eq!(
        origin.proxy.blob_bytes(),
        0,
        "listing repos fetches no blob"
    );

    // Reading component b: the tree, the header and b's chunk, nothing of a.
    let b = origin.mounted(&m.root, "b.safetensors");
    let started = Instant::now();
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    let elapsed = started.elapsed();
    let fetched = origin.proxy.blob_bytes();
    let expected: u64 = origin.chunks["b.safetensors"]
        .iter()
        .chain([&origin.commit, &origin.header])
        .map(|o| o.length)
        .sum();
    let model: u64 = origin.closure().iter().map(|o| o.length).sum();
    println!(
        "component b: {fetched} of the model's {model} bytes fetched ({:.1} %) in {elapsed:?}",
        100.0 * fetched as f64 / model as f64
    );
    assert_eq!(fetched, expected);
    for chunk in &origin.chunks["a.safetensors"] {
        assert_eq!(origin.proxy.gets(&chunk.sha256.hex()), 0);
        assert!(!local.contains(chunk));
    }

    // Then a (three chunks, read in order): the whole model, each object once.
    let a = origin.mounted(&m.root, "a.safetensors");
    assert_eq!(std::fs::read(&a).unwrap(), origin.files["a.safetensors"]);
    assert_eq!(origin.proxy.blob_bytes(), model);
    for object in origin.closure() {
        assert_eq!(origin.proxy.gets(&object.sha256.hex()), 1, "{object}");
        assert!(local.contains(&object));
    }
    // Read again: from the store and the page cache, nothing fetched.
    origin.proxy.forget();
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    assert!(origin
        .proxy
        .seen()
        .iter()
        .all(|s| !s.path.starts_with("/blobs/")));
    m.unmount();
    store_is_clean(&local);
}

#[test]
fn concurrent_readers_of_one_chunk_cause_one_fetch() {
    let origin = Origin::start("crowd", 2, Size::Small);
    let local = origin.local_store("local");
    let chunk = origin.chunks["a.safetensors"][0];
    // Slow, so every reader arrives while the fetch is under way.
    origin.proxy.add(Rule::always(
        &chunk.sha256.hex(),
        Fault::Delay(Duration::from_millis(700)),
    ));
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(30));
    let path = origin.mounted(&m.root, "a.safetensors");
    let expected = &origin.files["a.safetensors"];
    // Look the lane up first, so the readers race for the chunk only.
    std::fs::metadata(&path).unwrap();
    let readers: Vec<_> = (0..8u64)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let file = std::fs::File::open(&path).unwrap();
                let offset = 4096 + i * 200_000;
                let mut buf = vec![0u8; 4096];
                file.read_exact_at(&mut buf, offset).unwrap();
                (offset, buf)
            })
        })
        .collect();
    for reader in readers {
        let (offset, buf) = reader.join().unwrap();
        assert_eq!(buf, expected[offset as usize..offset as usize + 4096]);
    }
    assert_eq!(origin.proxy.gets(&chunk.sha256.hex()), 1, "one fetch");
    drop(m);
    store_is_clean(&local);
}

#[test]
fn after_unmount_a_mount_without_the_endpoint_serves_what_was_fetched() {
    let origin = Origin::start("offline", 3, Size::Small);
    let local = origin.local_store("local");
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(30));
    let b = origin.mounted(&m.root, "b.safetensors");
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    m.unmount();

    // The store names the commit as the endpoint does, and holds what was read.
    let repo = local
        .repo(&origin.name)
        .unwrap()
        .expect("the commit is named");
    assert_eq!(repo.releases.len(), 1);
    assert_eq!(repo.releases[0].lanes[&origin.lane], origin.commit);

    let offline = mount(&local);
    assert_eq!(list(&offline.root), ["@comfyui", "@hf", "acme"]);
    let b = origin.mounted(&offline.root, "b.safetensors");
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    // What was never read is not there.
    let a = origin.mounted(&offline.root, "a.safetensors");
    assert_eq!(errno(std::fs::read(&a)), libc::EIO);
    drop(offline);

    // With the endpoint again, the rest is fetched.
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(30));
    let a = origin.mounted(&m.root, "a.safetensors");
    assert_eq!(std::fs::read(&a).unwrap(), origin.files["a.safetensors"]);
    drop(m);
    store_is_clean(&local);
}

#[test]
fn a_static_origin_shows_the_models_named_and_an_unreachable_one_leaves_the_store() {
    let origin = Origin::start("named", 4, Size::Small);
    let local = origin.local_store("local");
    // A static host lists nothing: the model is named on the command line.
    let statics = http::StaticOrigin::start(&origin.root, http::StaticConfig::default());
    let m = mount_with(&local, |config| {
        let mut remote = LazyConfig::new(&statics.url);
        remote.repos = vec![origin.name.clone()];
        config.remote = Some(remote);
    });
    assert_eq!(list(&m.path("acme")), ["named"]);
    let b = origin.mounted(&m.root, "b.safetensors");
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    drop(m);

    // An endpoint nobody answers: the mount comes up with the store's refs.
    let m = mount_with(&local, |config| {
        let mut remote = LazyConfig::new("http://127.0.0.1:9");
        remote.startup_wait = Duration::from_secs(2);
        remote.fetch_deadline = Duration::from_secs(1);
        config.remote = Some(remote);
    });
    let b = origin.mounted(&m.root, "b.safetensors");
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    drop(m);
}

/// Unmounts `path` on drop, whatever the test did.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if tensorfs::fuse::session::is_mounted(&self.0) {
            let _ = tensorfs::fuse::session::unmount(&self.0, true);
        }
    }
}

#[test]
fn the_mount_verb_takes_an_endpoint_and_keeps_the_token_off_the_command_line() {
    let origin = Origin::start("verb", 5, Size::Small);
    let local = origin.local_store("local");
    let mnt = origin.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _cleanup = Cleanup(mnt.canonicalize().unwrap());
    let log = origin.dir.path().join("mount.log");
    let out = common::tensorfs()
        .arg("--store")
        .arg(local.root())
        .arg("mount")
        .arg(&mnt)
        .args(["--log-file", log.to_str().unwrap()])
        .args(["--fetch-deadline", "5s"])
        .env("TENSORFS_ENDPOINT", &origin.proxy.url)
        .env("TENSORFS_TOKEN", "s3cret-token")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(&origin.proxy.url), "{said}");
    let pid = said
        .split("daemon pid ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(cmdline.contains("--endpoint"), "{cmdline}");
    assert!(!cmdline.contains("s3cret-token"), "{cmdline}");
    let b = origin.mounted(&mnt, "b.safetensors");
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    common::ok(local.root(), &["unmount", mnt.to_str().unwrap()]);
    assert!(!tensorfs::fuse::session::is_mounted(
        &mnt.canonicalize().unwrap()
    ));
    // The daemon says what it fetched as it ends.
    let ended = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie has ended too (its parent, gone, left it to init).
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap()
            .trim_start()
            .starts_with('Z'),
        Err(_) => true,
    };
    fuse_support::wait_for(ended, "the daemon to end");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("fetched 3 objects"), "{log}");
}

#[test]
fn a_model_the_endpoint_publishes_while_mounted_appears() {
    let origin = Origin::start("early", 6, Size::Small);
    let local = origin.local_store("local");
    let m = mount_with(&local, |config| {
        let mut remote = LazyConfig::new(&origin.proxy.url);
        remote.refresh_interval = Duration::from_millis(300);
        config.remote = Some(remote);
    });
    assert_eq!(list(&m.path("acme")), ["early"]);
    let store = Store::open_existing(&origin.root).unwrap();
    fuse_support::set_repo(&store, "acme/late", vec![], vec![origin.commit]);
    fuse_support::wait_for(
        || list(&m.path("acme")) == ["early", "late"],
        "the new model to show",
    );
    let b = m
        .path("acme/late")
        .join(origin.commit.sha256.hex())
        .join(&origin.lane)
        .join("b.safetensors");
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    drop(m);
    // Both models now name the commit in the store.
    for name in ["acme/early", "acme/late"] {
        let repo = local.repo(name).unwrap().expect(name);
        assert!(repo.roots().any(|c| *c == origin.commit), "{name}");
    }
}

/// A store directory (`file://`, as `tensorfs upload` writes one) is an origin too: its models
/// list, and reading one file fetches only that file's chunks into the local store.
#[test]
fn a_store_directory_is_an_origin_of_the_lazy_mount() {
    let origin = Origin::start("dir", 3, Size::Small);
    let local = origin.local_store("local");
    let url = format!("file://{}", origin.root.display());
    let m = lazy_mount(&local, &url, Duration::from_secs(10));
    assert_eq!(list(&m.path("acme")), ["dir"]);
    let b = origin.mounted(&m.root, "b.safetensors");
    assert_eq!(std::fs::read(&b).unwrap(), origin.files["b.safetensors"]);
    for chunk in &origin.chunks["b.safetensors"] {
        assert!(local.contains(chunk));
    }
    for chunk in &origin.chunks["a.safetensors"] {
        assert!(!local.contains(chunk), "a's chunks stay unfetched");
    }
    m.unmount();
    store_is_clean(&local);
}

/// The bytes of every blob under `store/blobs`, sampled until stopped; the most seen.
struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Sampler {
    fn start(store: &Store) -> Sampler {
        let blobs = store.root().join("blobs");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                let bytes: u64 = walkdir(&blobs);
                peak = peak.max(bytes);
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        });
        Sampler { stop, thread }
    }

    fn peak(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn walkdir(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walkdir(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// Reads `file` whole from its start, past the page cache (dropped first, so the mount
/// serves every byte).
fn read_uncached(file: &std::fs::File) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain call on an open descriptor.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut bytes = vec![0u8; file.metadata().unwrap().len() as usize];
    if let Err(e) = file.read_exact_at(&mut bytes, 0) {
        panic!("{e}: {}", fuse_support::logs());
    }
    bytes
}

#[test]
fn a_lazy_mount_reading_three_times_its_cache_budget_stays_within_it() {
    // a: four chunks of 16 MiB; b: one of 4 MiB. The budget holds three of a's chunks (what
    // the kernel's reads in flight, 16 MiB of them, may touch at once, with the next one
    // fetched) beside b, not a whole.
    let origin = Origin::start("budget", 8, Size::Wide);
    let local = origin.local_store("local");
    let budget: u64 = 56 << 20;
    let m = mount_with(&local, |config| {
        let mut remote = LazyConfig::new(&origin.proxy.url);
        remote.cache_size = Some(budget);
        config.remote = Some(remote);
    });
    let sampler = Sampler::start(&local);
    let (a, b) = (
        origin.mounted(&m.root, "a.safetensors"),
        origin.mounted(&m.root, "b.safetensors"),
    );
    let mut read = 0;
    // a, more than the budget, while it stays open: its first chunk goes for its second.
    let file = std::fs::File::open(&a).unwrap();
    let bytes = read_uncached(&file);
    assert!(bytes == origin.files["a.safetensors"], "a reads right");
    read += bytes.len();
    // Its start again, still open: fetched again.
    let first = origin.chunks["a.safetensors"][0];
    assert_eq!(origin.proxy.gets(&first.sha256.hex()), 1);
    let bytes = read_uncached(&file);
    assert!(
        bytes == origin.files["a.safetensors"],
        "a reads right again"
    );
    read += bytes.len();
    assert!(
        origin.proxy.gets(&first.sha256.hex()) >= 2,
        "evicted, then fetched again"
    );
    drop(file);
    for path in [&b, &a, &a, &b] {
        let name = path.file_name().unwrap().to_str().unwrap();
        let bytes = read_uncached(&std::fs::File::open(path).unwrap());
        assert!(bytes == origin.files[name], "{name} reads right");
        read += bytes.len();
    }
    let peak = sampler.peak();
    // The daemon's own account agrees.
    let status = fuse_support::status(&m.root);
    let cache = &status["cache"];
    assert_eq!(cache["budget_bytes"], budget, "{status}");
    let counted = cache["peak_bytes"].as_u64().unwrap();
    assert!(counted <= budget, "{status}\n{}", fuse_support::logs());
    assert!(cache["evicted"].as_u64().unwrap() > 0, "{status}");
    assert!(status["fetch"]["objects"].as_u64().unwrap() > 5, "{status}");
    assert_eq!(status["read_errors"], 0, "{status}");
    println!(
        "read {} MiB through a cache of {} MiB: its peak was {:.2} MiB on disk ({:.2} of the \
         budget), {:.2} MiB by the daemon's count; {} objects evicted",
        read >> 20,
        budget >> 20,
        peak as f64 / (1 << 20) as f64,
        peak as f64 / budget as f64,
        counted as f64 / (1 << 20) as f64,
        cache["evicted"]
    );
    assert!(read as u64 >= 3 * budget, "read {read} bytes");
    // A walk of the folder is not atomic: it may see a chunk evicted after it was counted
    // and one landed since, so it may overcount by one chunk.
    let chunk = origin.chunks["a.safetensors"][0].length;
    assert!(
        peak <= budget + chunk,
        "the cache peaked at {peak} bytes over {budget}: {}",
        fuse_support::logs()
    );
    m.unmount();
    store_is_clean(&local);
    // A cached model partly evicted is noted by verify, not failed: what is there is intact.
    let out = common::run(local.root(), &["verify"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("partial:") && said.contains("tensorfs download acme/budget"),
        "{said}"
    );
    // What stayed reads offline.
    let offline = mount(&local);
    let b = origin.mounted(&offline.root, "b.safetensors");
    assert!(std::fs::read(&b).unwrap() == origin.files["b.safetensors"]);
}

#[test]
fn a_mount_started_over_its_cache_budget_brings_the_cache_within_it() {
    // a: one chunk of 2 MiB, b: one of 1 MiB; both fetched by a mount without a budget, then
    // left past the grace.
    let origin = Origin::start("trim", 9, Size::Small);
    let local = origin.local_store("local");
    let m = lazy_mount(&local, &origin.proxy.url, Duration::from_secs(10));
    for name in ["a.safetensors", "b.safetensors"] {
        let read = std::fs::read(origin.mounted(&m.root, name)).unwrap();
        assert!(read == origin.files[name], "{name} reads right");
    }
    m.unmount();
    let before = walkdir(&local.root().join("blobs"));
    assert!(before > 3 << 20, "both fetched: {before} bytes");
    common::age(&local.root().join("blobs"), Duration::from_secs(7200));
    common::age(&local.root().join("uses"), Duration::from_secs(7200));

    // A mount with a budget of half the cache evicts at its start, before any read.
    let budget = before / 2;
    let m = mount_with(&local, |config| {
        let mut remote = LazyConfig::new(&origin.proxy.url);
        remote.cache_size = Some(budget);
        config.remote = Some(remote);
    });
    let stored = walkdir(&local.root().join("blobs"));
    let status = fuse_support::status(&m.root);
    assert!(
        stored <= budget,
        "{stored} bytes stored over a budget of {budget}: {status}"
    );
    assert!(status["cache"]["evicted"].as_u64().unwrap() > 0, "{status}");
    // What went is fetched again when read.
    for name in ["a.safetensors", "b.safetensors"] {
        let read = std::fs::read(origin.mounted(&m.root, name)).unwrap();
        assert!(read == origin.files[name], "{name} reads right again");
    }
    m.unmount();
    store_is_clean(&local);
}

/// ABI 2 of the extents ioctl on a lazy mount: the whole-file query fetches the file's chunks
/// before it answers (the caller reads the blobs itself), and keeps them while the file is
/// open, even when reads of another file evict everything else.
#[test]
fn a_whole_file_query_fetches_its_chunks_and_keeps_them_while_open() {
    let origin = Origin::start("kept", 10, Size::Wide);
    let local = origin.local_store("local");
    let budget: u64 = 56 << 20;
    let m = mount_with(&local, |config| {
        let mut remote = LazyConfig::new(&origin.proxy.url);
        remote.cache_size = Some(budget);
        config.remote = Some(remote);
    });
    let b = std::fs::File::open(origin.mounted(&m.root, "b.safetensors")).unwrap();
    let chunk = origin.chunks["b.safetensors"][0];
    assert!(!local.contains(&chunk), "nothing fetched yet");
    let text = tensorfs::extents::ioctl::query_file(&b, "b.safetensors").unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(doc["blobs"][0][0], chunk.sha256.hex(), "{doc}");
    assert!(local.contains(&chunk), "fetched before the answer");
    assert_eq!(origin.proxy.gets(&chunk.sha256.hex()), 1);
    // a is larger than the budget: reading it evicts what it can, never b's kept chunk.
    let a = std::fs::File::open(origin.mounted(&m.root, "a.safetensors")).unwrap();
    assert!(read_uncached(&a) == origin.files["a.safetensors"]);
    let status = fuse_support::status(&m.root);
    assert!(status["cache"]["evicted"].as_u64().unwrap() > 0, "{status}");
    assert!(local.contains(&chunk), "kept while b is open: {status}");
    let path = local.object_path(&chunk);
    let mut bytes = vec![0u8; chunk.length as usize];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact_at(&mut bytes, 0)
        .unwrap();
    assert_eq!(tensorfs::format::ObjectRef::of(&bytes), chunk);
    drop((a, b));
    m.unmount();
    store_is_clean(&local);
}
