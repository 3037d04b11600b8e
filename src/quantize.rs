//! `tensorfs quantize`: a new lane of a checkpoint with its weights encoded by one of the
//! schemes [`crate::encode`] writes.
//!
//! Every plain F32/BF16/F16 tensor of rank two or more whose key ends in `weight` and that
//! the scheme can hold is quantized (one holding a NaN or infinity, which no scale carries, is
//! kept and reported); every other tensor keeps its location in the source's chunks, so the new
//! lane shares those chunks (and their blobs) with the source. New parts are
//! laid out by the §10 rule per component, placed as they are produced, and written as they
//! fill, so memory holds one tensor at a time. The header keeps the source's components,
//! configs and assets, drops its `source_files` (the producer's files no longer hold these
//! tensors) and records `provenance`. Objects are staged and published together, as an import
//! does: a failure leaves the store as it was.

use std::collections::BTreeMap;
use std::io::Write;

use crate::encode::{self, OwnedPart};
use crate::format::header::HEADER_FORMAT;
use crate::format::names::is_label;
use crate::format::{
    Body, Component, Encoding, Header, Location, ObjectRef, Part, Tensor, Tree, Value,
};
use crate::import::chunks::{Planner, CHUNK_MAX_BYTES};
use crate::import::{check_name, header_name, publish, stage_bytes, ImportError};
use crate::io::ObjectSource;
use crate::io::{BlobReader, BlobReaderConfig};
use crate::layout::recipe::SOURCE_FILES;
use crate::store::{Commit, ObjectWriter, Staged, Store, StoreError};

/// What a quantize made.
#[derive(Clone, Debug, serde::Serialize)]
pub struct QuantizeReport {
    /// The repo written to.
    pub name: String,
    /// The new lane.
    pub lane: String,
    /// The new commit, `sha256:<hex>`.
    pub commit: String,
    /// The new header, `sha256:<hex>`.
    pub header: String,
    /// Tensors encoded.
    pub quantized: usize,
    /// Tensors kept as they were (sharing the source's chunks).
    pub kept: usize,
    /// Bytes of the encoded parts.
    pub encoded_bytes: u64,
    /// Bytes of the kept tensors.
    pub kept_bytes: u64,
    /// Weights the scheme could not hold faithfully (a NaN or infinity), kept as they were, with
    /// why.
    pub left_plain: Vec<(String, String)>,
}

/// Writes a new commit of repo `name`, lane `lane`: `source` with its weights encoded by
/// `scheme`.
///
/// # Errors
/// A bad name, lane or scheme ([`ImportError::Usage`]), a blob that cannot be read, or the store
/// cannot be written; the store is then as it was.
pub fn quantize(
    store: &Store,
    source: &Commit,
    scheme: &str,
    name: &str,
    lane: &str,
) -> Result<QuantizeReport, ImportError> {
    check_name(name)?;
    if !is_label(lane) {
        return Err(ImportError::Usage(format!(
            "lane {lane:?} is not a label (letters, digits, ._+!-)"
        )));
    }
    if !encode::SCHEMES.contains(&scheme) {
        return Err(ImportError::Usage(
            encode::EncodeError::UnknownScheme(scheme.into()).to_string(),
        ));
    }
    let reader = BlobReader::new(store.clone(), BlobReaderConfig::default());
    let src = &source.header;
    let mut header = Header {
        format: HEADER_FORMAT.into(),
        chunks: Vec::new(),
        encodings: Vec::new(),
        pipeline: src.pipeline.clone(),
        components: Vec::new(),
        metadata: src.metadata.clone(),
    };
    // The new lane's files are the libraries' (its tensors changed): neither the source's
    // recipe nor its single file's record describes them.
    header.metadata.remove(SOURCE_FILES);
    header.metadata.remove(crate::layout::SINGLE_FILE);
    let mut kept = KeptChunks::default();
    let mut staged: Vec<Staged> = Vec::new();
    let mut report = QuantizeReport {
        name: name.into(),
        lane: lane.into(),
        commit: String::new(),
        header: String::new(),
        quantized: 0,
        kept: 0,
        encoded_bytes: 0,
        kept_bytes: 0,
        left_plain: Vec::new(),
    };
    for c in &src.components {
        let mut chunks = ChunkWriter::new(store);
        let mut tensors = Vec::with_capacity(c.tensors.len());
        // Parts placed in this component's new chunks, whose indices are fixed at its end.
        let mut new_parts: Vec<(usize, usize)> = Vec::new();
        for t in &c.tensors {
            let quantized = match &t.body {
                Body::Plain(location)
                    if t.key.ends_with("weight")
                        && encode::fits(scheme, &t.dtype, &t.shape).is_ok() =>
                {
                    let bytes = read(&reader, src, *location)?;
                    match encode::quantize(scheme, &t.dtype, &t.shape, &bytes) {
                        Ok(q) => Some(q),
                        Err(why) => {
                            report
                                .left_plain
                                .push((format!("{}/{}", c.name, t.key), why.to_string()));
                            None
                        }
                    }
                }
                _ => None,
            };
            let Some(quantized) = quantized else {
                report.kept += 1;
                report.kept_bytes += locations(t).map(|l| l.length).sum::<u64>();
                tensors.push(kept.remap(t, src, &mut header));
                continue;
            };
            let encoding = Encoding {
                scheme: scheme.into(),
                params: quantized.params,
            };
            let index = cite(&mut header.encodings, encoding);
            let mut parts = Vec::with_capacity(quantized.parts.len());
            for OwnedPart {
                role,
                dtype,
                shape,
                bytes,
            } in quantized.parts
            {
                report.encoded_bytes += bytes.len() as u64;
                let location = chunks.put(&t.key, &bytes)?;
                new_parts.push((tensors.len(), parts.len()));
                parts.push(Part {
                    role: role.into(),
                    dtype,
                    shape,
                    location,
                });
            }
            report.quantized += 1;
            tensors.push(Tensor {
                key: t.key.clone(),
                dtype: t.dtype.clone(),
                shape: t.shape.clone(),
                body: Body::Encoded {
                    encoding: index,
                    parts,
                },
            });
        }
        let base = header.chunks.len() as u64;
        let (refs, mut written) = chunks.finish()?;
        header.chunks.extend(refs);
        staged.append(&mut written);
        for (t, p) in new_parts {
            if let Body::Encoded { parts, .. } = &mut tensors[t].body {
                if parts[p].location.length > 0 {
                    parts[p].location.chunk += base;
                }
            }
        }
        header.components.push(Component {
            tensors,
            ..c.clone()
        });
    }
    header.metadata.insert(
        "provenance".into(),
        Value::map([
            ("package".to_owned(), Value::Text("tensorfs".into())),
            (
                "release".to_owned(),
                Value::Text(env!("CARGO_PKG_VERSION").into()),
            ),
            (
                "recipe".to_owned(),
                Value::Text(format!("{scheme} round-to-nearest")),
            ),
            ("source".to_owned(), Value::Text(source.header_ref.id())),
        ]),
    );
    let bytes = header.to_cbor().map_err(|source| ImportError::Encode {
        what: "the quantized header".to_owned(),
        source,
    })?;
    let header_ref = stage_bytes(store, &bytes, &mut staged)?;
    let mut files: BTreeMap<String, ObjectRef> = source
        .tree
        .repo_files()
        .map(|(p, o)| (p.to_owned(), *o))
        .collect();
    files.insert(header_name(&files), header_ref);
    let tree = Tree {
        lane: Some(lane.into()),
        files,
    };
    let commit = stage_bytes(store, &tree.to_json(), &mut staged)?;
    publish(store, staged, name, &[commit])?;
    report.commit = commit.id();
    report.header = header_ref.id();
    Ok(report)
}

/// Every location a tensor's bytes are at.
fn locations(t: &Tensor) -> impl Iterator<Item = Location> + '_ {
    let (plain, parts) = match &t.body {
        Body::Plain(location) => (Some(*location), &[][..]),
        Body::Encoded { parts, .. } => (None, &parts[..]),
    };
    plain.into_iter().chain(parts.iter().map(|p| p.location))
}

/// The index of `encoding` in `encodings`, added when new (so encodings are listed in order of
/// first citation, spec §4).
fn cite(encodings: &mut Vec<Encoding>, encoding: Encoding) -> usize {
    match encodings.iter().position(|e| *e == encoding) {
        Some(i) => i,
        None => {
            encodings.push(encoding);
            encodings.len() - 1
        }
    }
}

/// Source chunks the new header cites, added when a kept tensor first needs them.
#[derive(Default)]
struct KeptChunks {
    /// A source location's first chunk → its index in the new header.
    runs: BTreeMap<(usize, usize), u64>,
}

impl KeptChunks {
    /// `t` citing the source's chunks through the new header, whose chunk list grows with each
    /// run of chunks a location spans (a run stays consecutive, as locations need); an encoded
    /// tensor's encoding is cited anew.
    fn remap(&mut self, t: &Tensor, src: &Header, header: &mut Header) -> Tensor {
        let mut map = |l: Location| {
            if l.length == 0 {
                return Location::default();
            }
            let pieces: Vec<usize> = src.pieces(l).map(|(chunk, _, _)| chunk).collect();
            let key = (pieces[0], pieces.len());
            let chunk = *self.runs.entry(key).or_insert_with(|| {
                let first = header.chunks.len() as u64;
                header.chunks.extend(pieces.iter().map(|&c| src.chunks[c]));
                first
            });
            Location { chunk, ..l }
        };
        let body = match &t.body {
            Body::Plain(location) => Body::Plain(map(*location)),
            Body::Encoded { encoding, parts } => {
                let parts = parts
                    .iter()
                    .map(|p| Part {
                        location: map(p.location),
                        ..p.clone()
                    })
                    .collect();
                let index = cite(&mut header.encodings, src.encodings[*encoding].clone());
                Body::Encoded {
                    encoding: index,
                    parts,
                }
            }
        };
        Tensor { body, ..t.clone() }
    }
}

/// The bytes at `location`, verified.
fn read(reader: &BlobReader, header: &Header, location: Location) -> Result<Vec<u8>, ImportError> {
    let mut bytes = vec![0u8; location.length as usize];
    let mut at = 0;
    for (chunk, offset, length) in header.pieces(location) {
        reader
            .read_object(
                &header.chunks[chunk],
                offset,
                &mut bytes[at..at + length as usize],
            )
            .map_err(|e| StoreError::Io {
                op: "read",
                path: reader.store().object_path(&header.chunks[chunk]),
                source: e,
            })?;
        at += length as usize;
    }
    Ok(bytes)
}

/// New chunks of one component, written as parts are placed (the §10 rule, one part at a time).
struct ChunkWriter<'s> {
    store: &'s Store,
    planner: Planner,
    /// The open pack and the bytes written to it.
    pack: Option<(usize, ObjectWriter)>,
    /// Finished chunks by index (relative to `base`).
    done: BTreeMap<usize, Staged>,
}

impl<'s> ChunkWriter<'s> {
    fn new(store: &'s Store) -> Self {
        ChunkWriter {
            store,
            planner: Planner::new(),
            pack: None,
            done: BTreeMap::new(),
        }
    }

    fn io(&self, e: std::io::Error) -> ImportError {
        ImportError::Store(StoreError::Io {
            op: "write",
            path: self.store.root().join("tmp"),
            source: e,
        })
    }

    /// Places and writes one part; its location among this component's new chunks.
    fn put(&mut self, key: &str, bytes: &[u8]) -> Result<Location, ImportError> {
        let place = self.planner.place(key, bytes.len() as u64);
        if bytes.is_empty() {
            return Ok(place);
        }
        let chunk = place.chunk as usize;
        if place.offset == 0 && self.planner.open_pack() != Some(chunk) {
            // Standalone: its own chunks, each written whole.
            for (i, piece) in bytes.chunks(CHUNK_MAX_BYTES as usize).enumerate() {
                let mut writer = self.store.writer()?;
                writer.write_all(piece).map_err(|e| self.io(e))?;
                self.done.insert(chunk + i, writer.finish_staged()?);
            }
        } else {
            if self.pack.as_ref().is_some_and(|(c, _)| *c != chunk) {
                self.close_pack()?;
            }
            if self.pack.is_none() {
                self.pack = Some((chunk, self.store.writer()?));
            }
            let (_, writer) = self.pack.as_mut().expect("opened above");
            let pad = place.offset - writer.len();
            let written = writer
                .write_zeros(pad)
                .and_then(|()| writer.write_all(bytes));
            written.map_err(|e| self.io(e))?;
        }
        Ok(place)
    }

    fn close_pack(&mut self) -> Result<(), ImportError> {
        if let Some((chunk, writer)) = self.pack.take() {
            self.done.insert(chunk, writer.finish_staged()?);
        }
        Ok(())
    }

    /// The new chunks' objects in index order, and their staged files.
    fn finish(mut self) -> Result<(Vec<ObjectRef>, Vec<Staged>), ImportError> {
        self.close_pack()?;
        debug_assert_eq!(self.done.len(), self.planner.chunks().len());
        let refs = self.done.values().map(|s| *s.object()).collect();
        Ok((refs, self.done.into_values().collect()))
    }
}
