//! The extents ioctl on a real mount (the tests run as root with /dev/fuse): raw queries by the
//! documented layout, paging through a tensor of 201 extents, every extent's blob bytes against
//! the mount's, errnos, `tensorfs locate PATH TENSOR`, and a C client built against
//! `packaging/tensorfs_extents.h`.

mod common;
mod fuse_support;
mod skip;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use common::floats;
use fuse_support::*;
use tensorfs::extents::{self, ioctl};
use tensorfs::format::{Body, Dtype, Location, ObjectRef, Tensor};
use tensorfs::layout::LaneView;
use tensorfs::store::Store;

/// Chunks `big.weight` touches: its first 4 KiB end chunk 0, 199 chunks of 4 KiB follow, and
/// its last 2 KiB start chunk 200.
const BIG_CHUNKS: usize = 201;
const FILE: &str = "local/many/1.0/f32/model.safetensors";

/// A commit whose `big.weight` spans [`BIG_CHUNKS`] small chunks, beside `small.weight` (the
/// first 4 KiB of chunk 0) and `tail.bias` (its own chunk).
fn many_chunks(store: &Store) -> (ObjectRef, Vec<u8>) {
    let small = noise(4096, 1);
    let big = noise(4096 + 199 * 4096 + 2048, 2);
    let tail = noise(2000, 3);
    let mut chunks = vec![[&small[..], &big[..4096]].concat()];
    chunks.extend(
        big[4096..4096 + 199 * 4096]
            .chunks(4096)
            .map(<[u8]>::to_vec),
    );
    chunks.push(big[4096 + 199 * 4096..].to_vec());
    chunks.push(tail.clone());
    let chunks: Vec<ObjectRef> = chunks.iter().map(|c| store.put_bytes(c).unwrap()).collect();
    let tensors = vec![
        plain("small.weight", Dtype::F32, vec![1024], 0, 0, 4096),
        plain(
            "big.weight",
            Dtype::F32,
            vec![401, 512],
            0,
            4096,
            big.len() as u64,
        ),
        plain("tail.bias", Dtype::F16, vec![1000], 201, 0, 2000),
    ];
    let commit = put_commit(store, "local/many", chunks, tensors);
    (commit, big)
}

/// A plain tensor at `length` bytes from `offset` of chunk `chunk`.
fn plain(key: &str, dtype: Dtype, shape: Vec<u64>, chunk: u64, offset: u64, length: u64) -> Tensor {
    Tensor {
        key: key.into(),
        dtype,
        shape,
        body: Body::Plain(Location {
            chunk,
            offset,
            length,
        }),
    }
}

/// Commits a Transformers model of `tensors` in `chunks` as release 1.0, lane `f32`, of `repo`.
fn put_commit(
    store: &Store,
    repo: &str,
    chunks: Vec<ObjectRef>,
    tensors: Vec<Tensor>,
) -> ObjectRef {
    let commit = bert_commit(store, Some("f32"), chunks, vec![], tensors);
    set_repo(
        store,
        repo,
        vec![tensorfs::format::Release {
            version: "1.0".into(),
            lanes: BTreeMap::from([("f32".to_owned(), commit)]),
        }],
        vec![],
    );
    commit
}

/// Runs extents command `cmd` (struct of `size` bytes) for `name` and page or part `index`:
/// the struct back, or the errno.
fn raw(file: &File, cmd: u32, size: usize, name: &str, index: u32) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; size];
    buf[..4].copy_from_slice(&ioctl::ABI_VERSION.to_le_bytes());
    buf[4..8].copy_from_slice(&index.to_le_bytes());
    buf[16..16 + name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `buf` is the command's struct, exactly the size its number encodes.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    Ok(buf)
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().unwrap())
}

fn str_at(buf: &[u8], at: usize, len: usize) -> &str {
    let field = &buf[at..at + len];
    std::str::from_utf8(&field[..field.iter().position(|&b| b == 0).unwrap()]).unwrap()
}

#[test]
fn the_ioctl_pages_extents_whose_blob_bytes_are_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let (commit, big) = many_chunks(&store);
    let m = mount(&store);
    let path = m.path(FILE);
    let file = File::open(&path).unwrap();

    // TENSOR, read by the offsets docs/extents.md gives.
    let t = raw(&file, ioctl::TENSOR, ioctl::TENSOR_BYTES, "big.weight", 0).unwrap();
    assert_eq!(u32_at(&t, 0), ioctl::ABI_VERSION);
    assert_eq!(str_at(&t, 1040, 1024), "big.weight");
    assert_eq!(str_at(&t, 2064, 16), "F32");
    assert_eq!(u32_at(&t, 2080), 2, "rank");
    assert_eq!(u32_at(&t, 2084), 1, "parts");
    assert_eq!((u64_at(&t, 2088), u64_at(&t, 2096)), (401, 512));
    assert_eq!(u64_at(&t, 2152), BIG_CHUNKS as u64, "extents");
    let (begin, end) = (u64_at(&t, 2160), u64_at(&t, 2168));
    assert_eq!(end - begin, big.len() as u64);
    assert_eq!(u32_at(&t, 2176), 0, "plain");
    assert_eq!(str_at(&t, 2248, 4096), store.root().to_str().unwrap());
    let mut shown = vec![0u8; big.len()];
    file.read_exact_at(&mut shown, begin).unwrap();
    assert!(shown == big, "the file range holds the tensor");

    // PART 0, then EXTENTS in two pages.
    let p = raw(&file, ioctl::PART, ioctl::PART_BYTES, "big.weight", 0).unwrap();
    assert_eq!(str_at(&p, 1040, 64), "weight");
    assert_eq!((u64_at(&p, 1192), u64_at(&p, 1200)), (begin, end));
    assert_eq!((u64_at(&p, 1208), u64_at(&p, 1216)), (0, BIG_CHUNKS as u64));
    let mut extents = Vec::new();
    for page in 0..3 {
        let e = raw(
            &file,
            ioctl::EXTENTS,
            ioctl::EXTENTS_BYTES,
            "big.weight",
            page,
        )
        .unwrap();
        assert_eq!(u64_at(&e, 1040), BIG_CHUNKS as u64, "total");
        let count = u32_at(&e, 1048) as usize;
        assert_eq!(count, [128, 73, 0][page as usize], "page {page}");
        for i in 0..count {
            let x = &e[1056 + 104 * i..1056 + 104 * (i + 1)];
            let hex = std::str::from_utf8(&x[8..72]).unwrap().to_owned();
            extents.push((hex, u64_at(x, 80), u64_at(x, 88), u64_at(x, 96)));
        }
    }
    let mut at = begin;
    for (hex, offset, length, file_offset) in &extents {
        assert_eq!(*file_offset, at);
        let blob = store
            .root()
            .join(format!("blobs/{}/{}/{hex}", &hex[..2], &hex[2..4]));
        let mut direct = vec![0u8; *length as usize];
        File::open(&blob)
            .unwrap()
            .read_exact_at(&mut direct, *offset)
            .unwrap();
        let mut mounted = vec![0u8; *length as usize];
        file.read_exact_at(&mut mounted, *file_offset).unwrap();
        assert!(direct == mounted, "extent at file offset {file_offset}");
        at += length;
    }
    assert_eq!(at, end);
    assert_eq!((extents[0].1, extents[0].2), (4096, 4096));
    assert_eq!((extents[200].1, extents[200].2), (0, 2048));

    // The client of the library gives what the library says from the store.
    let through_mount = ioctl::query(&file, "model.safetensors", "big.weight").unwrap();
    let c = store.commit(&commit).unwrap();
    let view = LaneView::build(&c.id, &c.tree, &c.header).unwrap();
    let from_store = extents::locate(&store, &view, "model.safetensors", "big.weight").unwrap();
    assert_eq!(through_mount, from_store);
    let tail = ioctl::query(&file, "model.safetensors", "tail.bias").unwrap();
    assert_eq!(tail.extents.len(), 1);
    assert_eq!(
        tail,
        extents::locate(&store, &view, "model.safetensors", "tail.bias").unwrap()
    );

    // Errnos: unknown commands stay ENOTTY.
    let errno = |cmd: u32, size: usize, name: &str| raw(&file, cmd, size, name, 0).unwrap_err();
    assert_eq!(
        errno(ioctl::TENSOR, ioctl::TENSOR_BYTES, "nope"),
        libc::ENOENT
    );
    let unknown = ioctl::TENSOR & !0xFF | 9;
    assert_eq!(
        errno(unknown, ioctl::TENSOR_BYTES, "big.weight"),
        libc::ENOTTY
    );
    let mut termios = std::mem::MaybeUninit::<libc::termios>::uninit();
    // SAFETY: TCGETS writes a termios into the buffer we own.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TCGETS, termios.as_mut_ptr()) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTTY)
    );
    let part = raw(&file, ioctl::PART, ioctl::PART_BYTES, "big.weight", 1).unwrap_err();
    assert_eq!(part, libc::EINVAL, "part past the last");
    let config = File::open(m.path("local/many/1.0/f32/config.json")).unwrap();
    let r = raw(&config, ioctl::TENSOR, ioctl::TENSOR_BYTES, "big.weight", 0);
    assert_eq!(r.unwrap_err(), libc::EOPNOTSUPP);
    let err = ioctl::query(&config, "config.json", "big.weight").unwrap_err();
    assert_eq!(
        err.to_string(),
        "config.json: tensor \"big.weight\": not a safetensors file of a lane"
    );

    // The command line, through the mount.
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args(["locate", path.to_str().unwrap(), "big.weight", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["shape"], serde_json::json!([401, 512]));
    let listed = json["parts"][0]["extents"].as_array().unwrap();
    assert_eq!(listed.len(), BIG_CHUNKS);
    assert_eq!(listed[200]["file_offset"], extents[200].3);
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfs"))
        .args(["locate", path.to_str().unwrap(), "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: tensor \"nope\": no such tensor",
            path.display()
        )),
        "{stderr}"
    );

    c_client(&path, &from_store);
    drop((file, config));
    m.unmount();
}

/// Builds `tests/data/extents_client.c` against the packaged header and runs it on `path`;
/// skipped (with a message) only when there is no C compiler.
fn c_client(path: &Path, expected: &extents::Located) {
    if Command::new("cc").arg("--version").output().is_err() {
        skip::missing("the C client check: no C compiler (`cc`) on this machine");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("extents_client");
    let built = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(root.join("packaging"))
        .arg(root.join("tests/data/extents_client.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&exe)
        .arg(path)
        .arg("big.weight")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let part = &expected.parts[0];
    let want = format!(
        "commands {:#x} {:#x} {:#x}\nkey big.weight\ndtype F32\nshape 401 512\nscheme plain\n\
         parts 1\nextents {BIG_CHUNKS}\npart 0 weight F32 file {}..{} extents 0+{BIG_CHUNKS}\n\
         pages 2\nok\n",
        ioctl::TENSOR,
        ioctl::PART,
        ioctl::EXTENTS,
        part.file_range.start,
        part.file_range.end,
    );
    assert_eq!(stdout, want);
    let out = Command::new(&exe).arg(path).arg("nope").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "TENSORFS_IOC_TENSOR: No such file or directory\n"
    );
}

#[test]
fn an_encoded_tensor_answers_with_its_parts_and_the_decoded_view_with_enodata() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let mut chunk = floats(512, 1);
    chunk.resize(4096, 0);
    chunk.extend_from_slice(&floats(32, 2));
    let chunks = vec![store.put_bytes(&chunk).unwrap()];
    let tensors = vec![
        plain("dense.weight", Dtype::F32, vec![16, 32], 0, 0, 2048),
        plain("dense.bias", Dtype::F32, vec![32], 0, 4096, 128),
    ];
    let source = put_commit(&store, "local/q", chunks, tensors);
    let source = store.commit(&source).unwrap();
    let report =
        tensorfs::quantize::quantize(&store, &source, "int8.rowwise", "local/q", "int8").unwrap();
    assert_eq!(report.quantized, 1);
    let hex = report.commit.strip_prefix("sha256:").unwrap().to_owned();
    let m = mount(&store);
    let lane = m.path(&format!("local/q/{hex}/int8/model.safetensors"));
    let file = File::open(&lane).unwrap();
    let t = raw(&file, ioctl::TENSOR, ioctl::TENSOR_BYTES, "dense.weight", 0).unwrap();
    assert_eq!(u32_at(&t, 2176), ioctl::FLAG_ENCODED);
    assert_eq!(str_at(&t, 2184, 64), "int8.rowwise");
    assert_eq!(u32_at(&t, 2084), 2, "parts");
    assert_eq!(
        (u64_at(&t, 2160), u64_at(&t, 2168)),
        (0, 0),
        "no range of its own"
    );
    let params_len = u32_at(&t, 2180) as usize;
    assert_eq!(&t[6344..6344 + params_len], b"{}");

    let located = ioctl::query(&file, "model.safetensors", "dense.weight").unwrap();
    let repo = store.repo("local/q").unwrap().unwrap();
    let quantized = *repo.commits.last().unwrap();
    assert_eq!(quantized.id(), report.commit);
    let c = store.commit(&quantized).unwrap();
    let view = LaneView::build(&c.id, &c.tree, &c.header).unwrap();
    let expected = extents::locate(&store, &view, "model.safetensors", "dense.weight").unwrap();
    assert_eq!(located, expected);
    for x in &located.extents {
        let mut direct = vec![0u8; x.length as usize];
        File::open(&x.path)
            .unwrap()
            .read_exact_at(&mut direct, x.offset)
            .unwrap();
        let mut mounted = vec![0u8; x.length as usize];
        file.read_exact_at(&mut mounted, x.file_offset).unwrap();
        assert!(direct == mounted, "part {}", located.parts[x.part].role);
    }

    let decoded =
        File::open(m.path(&format!("local/q/{hex}/int8@decoded/model.safetensors"))).unwrap();
    let r = raw(
        &decoded,
        ioctl::TENSOR,
        ioctl::TENSOR_BYTES,
        "dense.weight",
        0,
    );
    assert_eq!(r.unwrap_err(), libc::ENODATA);
    let bias = ioctl::query(&decoded, "model.safetensors", "dense.bias").unwrap();
    assert_eq!(bias.extents.len(), 1);
    let mut shown = vec![0u8; 128];
    decoded
        .read_exact_at(&mut shown, bias.parts[0].file_range.start)
        .unwrap();
    assert_eq!(shown, floats(32, 2));
    drop((file, decoded));
    m.unmount();
}

/// The ABI 2 answer of `file`, parsed.
fn described(file: &File) -> serde_json::Value {
    serde_json::from_slice(&ioctl::query_file(file, "model.safetensors").unwrap()).unwrap()
}

/// Every part the whole-file answer of `doc` names: its blob bytes are the file's at its
/// place; returns how many parts and extents were checked.
fn check_parts(doc: &serde_json::Value, file: &File) -> (usize, usize) {
    let store = Path::new(doc["store"].as_str().unwrap());
    let blobs = doc["blobs"].as_array().unwrap();
    let (mut parts, mut extents) = (0, 0);
    for tensor in doc["tensors"].as_array().unwrap() {
        for part in tensor["parts"].as_array().into_iter().flatten() {
            parts += 1;
            let mut at = part["begin"].as_u64().unwrap();
            for e in part["extents"].as_array().unwrap() {
                let [blob, offset, length, file_offset] =
                    [0, 1, 2, 3].map(|i| e[i].as_u64().unwrap());
                assert_eq!(file_offset, at, "extents follow each other in the file");
                let hex = blobs[blob as usize][0].as_str().unwrap();
                let object = ObjectRef {
                    sha256: hex.parse().unwrap(),
                    length: blobs[blob as usize][1].as_u64().unwrap(),
                };
                let mut direct = vec![0u8; length as usize];
                File::open(store.join(object.blob_path()))
                    .unwrap()
                    .read_exact_at(&mut direct, offset)
                    .unwrap();
                let mut mounted = vec![0u8; length as usize];
                file.read_exact_at(&mut mounted, file_offset).unwrap();
                assert!(direct == mounted, "{}: {e}", tensor["key"]);
                at += length;
                extents += 1;
            }
            assert_eq!(at, part["end"].as_u64().unwrap(), "{}", tensor["key"]);
        }
    }
    (parts, extents)
}

/// ABI 2: one query gives every tensor of the file with its parts' extents (paged: 201
/// extents do not fit one page), the blobs once each with the stamps of those the daemon
/// proved, and the ABI 1 commands still answer.
#[test]
fn the_whole_file_query_gives_every_tensor_and_its_blobs_stamps() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    many_chunks(&store);
    let m = mount(&store);
    let file = File::open(m.path(FILE)).unwrap();
    let doc = described(&file);
    let text = ioctl::query_file(&file, "model.safetensors").unwrap();
    assert!(
        text.len() > ioctl::FILE_PAGE_BYTES,
        "the answer takes more than one page: {} bytes",
        text.len()
    );
    assert_eq!(doc["abi"], 2);
    let keys: Vec<&str> = doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["small.weight", "big.weight", "tail.bias"]);
    assert_eq!(doc["tensors"][1]["dtype"], "F32");
    assert_eq!(doc["tensors"][1]["shape"], serde_json::json!([401, 512]));
    assert!(doc["tensors"][1]["encoding"].is_null());
    assert_eq!(check_parts(&doc, &file), (3, 1 + BIG_CHUNKS + 1));
    let blobs = doc["blobs"].as_array().unwrap();
    assert_eq!(blobs.len(), 202, "each chunk once");
    // The reads above proved the blobs: their stamps are their inodes'.
    let doc = described(&File::open(m.path(FILE)).unwrap());
    for blob in doc["blobs"].as_array().unwrap() {
        let object = ObjectRef {
            sha256: blob[0].as_str().unwrap().parse().unwrap(),
            length: blob[1].as_u64().unwrap(),
        };
        let meta = std::fs::metadata(store.object_path(&object)).unwrap();
        let stamp = tensorfs::store::verified::Stamp::of(&meta).fields();
        let said: Vec<i128> = blob[2]
            .as_array()
            .unwrap_or_else(|| panic!("no stamp for a proven blob: {blob}"))
            .iter()
            .map(|v| i128::from(v.as_i64().unwrap()))
            .collect();
        assert_eq!(said, stamp, "{blob}");
    }
    // Malformed: a wrong version, a reserved field, answer fields not zero.
    let mut buf = vec![0u8; ioctl::FILE_BYTES];
    buf[..4].copy_from_slice(&1u32.to_le_bytes());
    // SAFETY: `buf` is the command's struct, exactly the size its number encodes.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), ioctl::FILE as _, buf.as_mut_ptr()) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPROTO)
    );
    buf[..4].copy_from_slice(&2u32.to_le_bytes());
    buf[20] = 1;
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), ioctl::FILE as _, buf.as_mut_ptr()) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    // A page past the end is empty, not an error.
    let mut buf = vec![0u8; ioctl::FILE_BYTES];
    buf[..4].copy_from_slice(&2u32.to_le_bytes());
    buf[4..8].copy_from_slice(&99u32.to_le_bytes());
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), ioctl::FILE as _, buf.as_mut_ptr()) };
    assert_eq!(r, 0);
    assert_eq!(u64_at(&buf, 16), text.len() as u64);
    assert_eq!(u32_at(&buf, 24), 0);
    // ABI 1 still answers.
    let big = ioctl::query(&file, "model.safetensors", "big.weight").unwrap();
    assert_eq!(big.extents.len(), BIG_CHUNKS);
    // Not a safetensors file of a lane.
    let readme = File::open(m.path("local/many/1.0/f32/config.json")).unwrap();
    let err = ioctl::query_file(&readme, "config.json").unwrap_err();
    assert_eq!(err.errno(), Some(libc::EOPNOTSUPP), "{err}");
    drop((file, readme));
    m.unmount();
}

/// ABI 2 on an encoded lane gives the parts of each encoded tensor with its scheme; on its
/// decoded view, the decoded tensor is marked so (read it from the file) and plain ones keep
/// their extents.
#[test]
fn the_whole_file_query_marks_what_a_decoded_view_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let mut chunk = floats(512, 1);
    chunk.resize(4096, 0);
    chunk.extend_from_slice(&floats(32, 2));
    let chunks = vec![store.put_bytes(&chunk).unwrap()];
    let tensors = vec![
        plain("dense.weight", Dtype::F32, vec![16, 32], 0, 0, 2048),
        plain("dense.bias", Dtype::F32, vec![32], 0, 4096, 128),
    ];
    let source = put_commit(&store, "local/q", chunks, tensors);
    let source = store.commit(&source).unwrap();
    let report =
        tensorfs::quantize::quantize(&store, &source, "int8.rowwise", "local/q", "int8").unwrap();
    let hex = report.commit.strip_prefix("sha256:").unwrap().to_owned();
    let m = mount(&store);
    let lane = File::open(m.path(&format!("local/q/{hex}/int8/model.safetensors"))).unwrap();
    let doc = described(&lane);
    let weight = &doc["tensors"][0];
    assert_eq!(weight["key"], "dense.weight");
    assert_eq!(weight["encoding"]["scheme"], "int8.rowwise");
    assert_eq!(weight["encoding"]["params"], serde_json::json!({}));
    assert_eq!(weight["parts"].as_array().unwrap().len(), 2);
    assert_eq!(check_parts(&doc, &lane), (3, 3));
    let decoded =
        File::open(m.path(&format!("local/q/{hex}/int8@decoded/model.safetensors"))).unwrap();
    let doc = described(&decoded);
    let weight = &doc["tensors"][0];
    assert_eq!(weight["decoded"], true, "{doc}");
    assert_eq!(weight["scheme"], "int8.rowwise");
    assert!(weight.get("parts").is_none());
    let (begin, end) = (
        weight["begin"].as_u64().unwrap(),
        weight["end"].as_u64().unwrap(),
    );
    assert_eq!(end - begin, 16 * 32 * 4, "the decoded F32 bytes");
    assert_eq!(check_parts(&doc, &decoded), (1, 1), "the bias");
    drop((lane, decoded));
    m.unmount();
}
