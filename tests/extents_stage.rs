//! Staging located tensors with io_uring (`tensorfs::extents::stage`), the host half of
//! GPU-direct loading: bytes equal the lane file's across many chunks and reused buffers, with
//! fixed and plain reads; encoded tensors' parts; truncated and missing blobs; a failing sink.

mod fuse_support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use fuse_support::noise;
use tensorfs::extents::stage::{
    HostParts, Segment, SinkError, StageConfig, StageError, StageSink, Stager,
};
use tensorfs::extents::{self, Located};
use tensorfs::format::{Body, Dtype, Encoding, Location, ObjectRef, Part, Tensor};
use tensorfs::io::{BlobReader, BlobReaderConfig};
use tensorfs::layout::LaneView;
use tensorfs::store::Store;

const FILE: &str = "model.safetensors";

/// Sizes of the chunks `long.weight` runs through: uneven, so no chunk, buffer or read
/// boundary meets another by accident.
fn chunk_sizes() -> Vec<usize> {
    (0..37).map(|k| 5001 + 977 * (k % 5) + 13 * k).collect()
}

/// A commit of one component: `head.bias` (the first 4 KiB of chunk 0), `long.weight`
/// (the rest of every chunk in [`chunk_sizes`]) and an int8.rowwise `q` whose weight and scale
/// parts sit in the last chunk. Returns the commit and `long.weight`'s bytes.
fn commit(store: &Store) -> (ObjectRef, Vec<u8>) {
    let sizes = chunk_sizes();
    let total: usize = sizes.iter().sum();
    let all = noise(total, 11);
    let head = 4096;
    let long = all[head..].to_vec();
    let mut chunks = Vec::new();
    let mut at = 0;
    for size in &sizes {
        chunks.push(store.put_bytes(&all[at..at + size]).unwrap());
        at += size;
    }
    // The encoded tensor's chunk: 64 bytes of int8 weight, then 8 scales at 4 KiB (locations
    // start at multiples of 4096, spec §4).
    let q_chunk = noise(4096 + 32, 12);
    chunks.push(store.put_bytes(&q_chunk).unwrap());
    let location = |chunk: usize, offset, length| Location {
        chunk: chunk as u64,
        offset,
        length,
    };
    let tensors = vec![
        Tensor {
            key: "head.bias".into(),
            dtype: Dtype::F32,
            shape: vec![1024],
            body: Body::Plain(location(0, 0, head as u64)),
        },
        Tensor {
            key: "long.weight".into(),
            dtype: Dtype::U8,
            shape: vec![long.len() as u64],
            body: Body::Plain(location(0, head as u64, long.len() as u64)),
        },
        Tensor {
            key: "q".into(),
            dtype: Dtype::BF16,
            shape: vec![8, 8],
            body: Body::Encoded {
                encoding: 0,
                parts: vec![
                    Part {
                        role: "weight".into(),
                        dtype: Dtype::I8,
                        shape: vec![8, 8],
                        location: location(sizes.len(), 0, 64),
                    },
                    Part {
                        role: "scale".into(),
                        dtype: Dtype::F32,
                        shape: vec![8],
                        location: location(sizes.len(), 4096, 32),
                    },
                ],
            },
        },
    ];
    let encodings = vec![Encoding {
        scheme: "int8.rowwise".into(),
        params: BTreeMap::new(),
    }];
    let commit = fuse_support::bert_commit(store, Some("int8"), chunks, encodings, tensors);
    (commit, long)
}

fn lane_view(store: &Store, commit: &ObjectRef) -> LaneView {
    let c = store.commit(commit).unwrap();
    LaneView::build(&c.id, &c.tree, &c.header).unwrap()
}

/// Each part's bytes as the lane file shows them (what the mount serves).
fn file_parts(store: &Store, view: &LaneView, located: &Located) -> Vec<Vec<u8>> {
    let reader = BlobReader::new(store.clone(), BlobReaderConfig::default());
    let content = &view.file(&located.file).unwrap().content;
    located
        .parts
        .iter()
        .map(|p| {
            let mut buf = vec![0u8; (p.file_range.end - p.file_range.start) as usize];
            let n = content
                .read_at(&reader, p.file_range.start, &mut buf)
                .unwrap();
            assert_eq!(n, buf.len());
            buf
        })
        .collect()
}

/// Small buffers and reads, so a tensor of ~150 KiB takes dozens of fills of two buffers.
fn small(fixed_buffers: bool) -> StageConfig {
    StageConfig {
        buffers: 2,
        buffer_bytes: 4096,
        read_bytes: 1500,
        queue_depth: 8,
        fixed_buffers,
        ..StageConfig::default()
    }
}

fn stage(
    stager: &mut Stager,
    located: &Located,
) -> (HostParts, tensorfs::extents::stage::StageStats) {
    let mut parts = HostParts::for_located(located);
    let stats = stager.stage(located, &mut parts).unwrap();
    (parts, stats)
}

#[test]
fn a_tensor_across_many_chunks_is_staged_byte_for_byte_through_reused_fixed_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let (commit, long) = commit(&store);
    let view = lane_view(&store, &commit);
    let located = extents::locate(&store, &view, FILE, "long.weight").unwrap();
    assert_eq!(located.extents.len(), chunk_sizes().len());
    let mut stager = Stager::new(small(true)).unwrap();
    assert!(
        stager.fixed(),
        "the kernel registers anonymous buffers, so reads are ReadFixed"
    );
    let (parts, stats) = stage(&mut stager, &located);
    assert!(parts.parts[0] == long, "the staged bytes are the tensor's");
    assert!(parts.parts == file_parts(&store, &view, &located));
    assert_eq!(stats.bytes, long.len() as u64);
    assert_eq!(
        stats.fills,
        long.len().div_ceil(4096),
        "every fill is a full buffer but the last"
    );
    assert!(stats.reads >= long.len().div_ceil(1500), "{stats:?}");

    // The same stager again, and the other tensors of the file.
    let (again, _) = stage(&mut stager, &located);
    assert!(again == parts);
    let head = extents::locate(&store, &view, FILE, "head.bias").unwrap();
    assert_eq!(
        stage(&mut stager, &head).0.parts,
        file_parts(&store, &view, &head)
    );
}

#[test]
fn plain_reads_stage_the_same_bytes_when_buffers_are_not_registered() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let (commit, long) = commit(&store);
    let view = lane_view(&store, &commit);
    let located = extents::locate(&store, &view, FILE, "long.weight").unwrap();
    let mut stager = Stager::new(small(false)).unwrap();
    assert!(!stager.fixed());
    assert!(stage(&mut stager, &located).0.parts[0] == long);
}

#[test]
fn default_buffers_stage_a_tensor_that_continues_into_the_next_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = fuse_support::commit(&store, Some("f32"), 21);
    let view = lane_view(&store, &c.id);
    let mut stager = Stager::new(StageConfig::default()).unwrap();
    assert_eq!(stager.config().buffer_bytes, 8 << 20);
    for (i, name) in ["a.weight", "b.weight", "c.bias"].into_iter().enumerate() {
        let located = extents::locate(&store, &view, FILE, name).unwrap();
        let (parts, stats) = stage(&mut stager, &located);
        assert!(parts.parts[0] == c.tensors[i].bytes, "{name}");
        assert_eq!(stats.fills, 1, "{name} fits one 8 MiB buffer");
    }
}

#[test]
fn an_encoded_tensor_stages_each_part_from_one_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let (commit, _) = commit(&store);
    let view = lane_view(&store, &commit);
    let located = extents::locate(&store, &view, FILE, "q").unwrap();
    assert_eq!(located.parts.len(), 2);
    let mut stager = Stager::new(small(true)).unwrap();
    let mut recorder = Recorder::default();
    let stats = stager.stage(&located, &mut recorder).unwrap();
    assert_eq!(stats.fills, 1);
    recorder.check_reclaims();
    assert_eq!(
        recorder.segments,
        [vec![
            Segment {
                part: 0,
                part_offset: 0,
                buffer_offset: 0,
                length: 64
            },
            Segment {
                part: 1,
                part_offset: 0,
                buffer_offset: 64,
                length: 32
            }
        ]]
    );
    let (parts, _) = stage(&mut stager, &located);
    assert_eq!(parts.parts, file_parts(&store, &view, &located));
}

#[test]
fn a_truncated_blob_is_an_error_naming_the_tensor_and_the_blob_and_the_stager_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let (commit, _) = commit(&store);
    let view = lane_view(&store, &commit);
    let located = extents::locate(&store, &view, FILE, "long.weight").unwrap();
    let victim = located.extents[20].clone();
    let path = &victim.path;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cut = victim.offset + victim.length - 100;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(cut)
        .unwrap();

    let mut stager = Stager::new(small(true)).unwrap();
    let mut parts = HostParts::for_located(&located);
    let err = stager.stage(&located, &mut parts).unwrap_err();
    match &err {
        StageError::Eof {
            tensor,
            path: p,
            at,
            end,
            ..
        } => {
            assert_eq!(tensor, "long.weight");
            assert_eq!(p, path);
            assert_eq!(*end, victim.offset + victim.length, "the extent's end");
            assert!(
                (cut..*end).contains(at),
                "read to {at}, the blob ends at {cut}"
            );
        }
        other => panic!("not an EOF error: {other}"),
    }
    let message = err.to_string();
    assert!(
        message.starts_with("model.safetensors: tensor \"long.weight\": blob "),
        "{message}"
    );
    assert!(message.contains(path.to_str().unwrap()), "{message}");
    assert!(message.contains("truncated"), "{message}");

    // Nothing of that run leaks into the next one.
    let head = extents::locate(&store, &view, FILE, "head.bias").unwrap();
    assert_eq!(
        stage(&mut stager, &head).0.parts,
        file_parts(&store, &view, &head)
    );

    std::fs::remove_file(path).unwrap();
    let err = stager.stage(&located, &mut parts).unwrap_err();
    assert!(matches!(err, StageError::Open { .. }), "{err}");
    assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
}

/// Records segments and the order of calls; fails on fill `fail_at` when set.
#[derive(Default)]
struct Recorder {
    segments: Vec<Vec<Segment>>,
    fail_at: Option<usize>,
    /// `(consume?, slot)` in call order.
    calls: Vec<(bool, usize)>,
}

impl Recorder {
    /// The sink's contract held: a buffer is consumed again only after a reclaim, and every
    /// buffer consumed was reclaimed last.
    fn check_reclaims(&self) {
        let mut held = BTreeMap::new();
        for &(consume, slot) in &self.calls {
            let was = held.insert(slot, consume);
            assert!(
                !(consume && was == Some(true)),
                "buffer {slot} refilled before its reclaim: {:?}",
                self.calls
            );
        }
        assert!(
            held.values().all(|&h| !h),
            "not reclaimed at the end: {:?}",
            self.calls
        );
    }
}

impl StageSink for Recorder {
    fn consume(
        &mut self,
        slot: usize,
        _buffer: &[u8],
        segments: &[Segment],
    ) -> Result<(), SinkError> {
        if self.fail_at == Some(self.segments.len()) {
            return Err("the device is full".into());
        }
        self.calls.push((true, slot));
        self.segments.push(segments.to_vec());
        Ok(())
    }

    fn reclaim(&mut self, slot: usize) -> Result<(), SinkError> {
        self.calls.push((false, slot));
        Ok(())
    }
}

#[test]
fn a_failing_sink_stops_the_stage_with_its_error_and_every_buffer_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let (commit, long) = commit(&store);
    let view = lane_view(&store, &commit);
    let located = extents::locate(&store, &view, FILE, "long.weight").unwrap();
    let mut stager = Stager::new(small(true)).unwrap();
    let mut sink = Recorder {
        fail_at: Some(5),
        ..Recorder::default()
    };
    let err = stager.stage(&located, &mut sink).unwrap_err();
    assert!(matches!(err, StageError::Sink { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "model.safetensors: tensor \"long.weight\": the device is full"
    );
    assert_eq!(sink.segments.len(), 5);
    sink.check_reclaims();
    assert!(stage(&mut stager, &located).0.parts[0] == long);
}
