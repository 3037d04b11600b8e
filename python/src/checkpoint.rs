//! The format's API: a commit of a local store opened by reference, its components' configs,
//! assets and tensors, and tensor reads (stored, or decoded by `tensorfs::decode`) into
//! [`Array`]s. `cozytensors/_api.py` is its Python face.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tensorfs::decode;
#[cfg(feature = "cuda")]
use tensorfs::extents::Located;
use tensorfs::format::{Body, Component, Dtype, Header, Location, ObjectRef, Tensor, Value};
use tensorfs::fs::Catalog;
use tensorfs::io::{ObjectRead, ObjectSource};
use tensorfs::lazy::{LazyConfig, LazyError, LazyMount};
use tensorfs::revisions::{self, ResolveError, Target};
use tensorfs::store::retention::Hold;
use tensorfs::store::{Commit, Store, StoreError};

use crate::array::{Array, Bytes, Storage};
#[cfg(feature = "cuda")]
use crate::device;
use crate::failure::failure;

fn store_failure(e: &StoreError) -> PyErr {
    let code = match e {
        StoreError::Absent { .. } => "not_found",
        StoreError::Mismatch { .. } => "integrity",
        StoreError::Format { .. } | StoreError::NotAStore { .. } => "format",
        StoreError::NoSpace { .. } => "full",
        _ => "io",
    };
    failure(code, e.to_string())
}

/// The failure of a read; `remote`: of a checkpoint fetched from an endpoint, whose failed
/// transfers are `TimedOut` (no progress within the fetch deadline) or `Other` (a final
/// answer), never the kinds of a damaged or absent local blob.
fn read_failure(what: &str, e: &std::io::Error, remote: bool) -> PyErr {
    failure(read_code(e.kind(), remote), format!("{what}: {e}"))
}

fn read_code(kind: std::io::ErrorKind, remote: bool) -> &'static str {
    use std::io::ErrorKind;
    match kind {
        ErrorKind::InvalidData | ErrorKind::UnexpectedEof => "integrity",
        ErrorKind::NotFound => "not_found",
        ErrorKind::TimedOut | ErrorKind::Other if remote => "network",
        _ => "io",
    }
}

/// One commit of a store, opened by [`open_checkpoint`]; its objects are held (the retention
/// regime's `holds/` record) until [`Checkpoint::close`] or the object is dropped.
#[pyclass(module = "cozytensors._native", frozen)]
pub struct Checkpoint {
    root: PathBuf,
    /// The store's blobs, or for a remote checkpoint the lazy mount's fetching source.
    reader: Arc<dyn ObjectSource>,
    /// Whether `reader` fetches from an endpoint.
    remote: bool,
    commit: Commit,
    repo: Option<String>,
    release: Option<String>,
    lane: String,
    hold: Mutex<Option<Hold>>,
}

fn resolve_failure(e: &ResolveError) -> PyErr {
    match e {
        ResolveError::Store(s) => store_failure(s),
        ResolveError::Source(_) => failure("network", e.to_string()),
        e if e.is_not_found() => failure("not_found", e.to_string()),
        e => failure("invalid", e.to_string()),
    }
}

/// Opens the commit that `name` (`org/name`, or `sha256:<commit>`), `release` (a version or a
/// commit; `None`: the newest) and `lane` (`None`: the revision's only lane) name in the store
/// at `store`; with `endpoint`, the commit the endpoint names (`org/name` only), whose
/// documents and, as they are read, chunks are fetched into the store at `store` (a cache
/// with the lazy mount's rules: `tensorfs::lazy`).
///
/// # Errors
/// `Failure` `not_found` (no such store, repo, revision or lane), `invalid` (several lanes and
/// none named, a malformed name, an endpoint URL refused), `format`, `integrity` or `io`
/// (documents that cannot be read), `network` (an endpoint that fails).
#[pyfunction]
#[pyo3(signature = (store, name, release=None, lane=None, endpoint=None, token=None))]
pub fn open_checkpoint(
    py: Python<'_>,
    store: PathBuf,
    name: &str,
    release: Option<&str>,
    lane: Option<&str>,
    endpoint: Option<&str>,
    token: Option<String>,
) -> PyResult<Checkpoint> {
    // `name@rev` with `release=rev` says the same twice; with another release, it is refused.
    let release = match (name.split_once('@'), release) {
        (Some((_, named)), Some(release)) if named == release => None,
        (Some(_), Some(_)) => {
            return Err(failure(
                "invalid",
                format!("{name:?} names a revision after '@' and release= names another"),
            ))
        }
        (_, release) => release,
    };
    let reference = match release {
        Some(release) => format!("{name}@{release}"),
        None => name.to_owned(),
    };
    let (opened, target, commit, source) = match endpoint {
        None => {
            if !store.exists() {
                return Err(failure(
                    "not_found",
                    format!(
                        "no store at {} (tensorfs import creates one)",
                        store.display()
                    ),
                ));
            }
            let opened = Store::open_existing(&store).map_err(|e| store_failure(&e))?;
            let (target, commit) =
                crate::detached(py, || revisions::resolve_one(&opened, &reference, lane))
                    .map_err(|e| resolve_failure(&e))?;
            let source: Arc<dyn ObjectSource> = crate::reader(&store)?;
            (opened, target, commit, source)
        }
        Some(endpoint) => {
            let opened = Store::open(&store).map_err(|e| store_failure(&e))?;
            let (target, commit, source) = crate::detached(py, || {
                open_remote(&opened, endpoint, token, &reference, lane)
            })?;
            (opened, target, commit, source)
        }
    };
    // A store this process may only read is read without a hold (as a mount reads it).
    let hold = opened
        .hold(
            commit
                .header
                .objects()
                .chain([&commit.header_ref, &commit.id]),
        )
        .ok();
    let release = release
        .map(str::to_owned)
        .or_else(|| name.split_once('@').map(|(_, r)| r.to_owned()))
        .filter(|r| r != revisions::LATEST);
    Ok(Checkpoint {
        reader: source,
        remote: endpoint.is_some(),
        root: store,
        commit,
        repo: target.repo,
        release,
        lane: target.lane,
        hold: Mutex::new(hold),
    })
}

/// The commit that `reference` and `lane` name at `endpoint`, its documents fetched into
/// `store`, and the source that fetches its chunks as they are read.
fn open_remote(
    store: &Store,
    endpoint: &str,
    token: Option<String>,
    reference: &str,
    lane: Option<&str>,
) -> PyResult<(Target, Commit, Arc<dyn ObjectSource>)> {
    revisions::check_reference(reference).map_err(|e| resolve_failure(&e))?;
    let (Some(name), _) = revisions::split_reference(reference) else {
        return Err(failure(
            "invalid",
            format!("{reference}: name the endpoint's model as org/name[@revision]"),
        ));
    };
    if tensorfs::remote::is_local(name) {
        return Err(failure(
            "invalid",
            format!("{name}: the org `local` is this machine's own; endpoints never serve it"),
        ));
    }
    let mut config = LazyConfig::new(endpoint);
    config.token = token;
    config.repos = vec![name.to_owned()];
    let lazy = LazyMount::open(store.clone(), config).map_err(|e| match &e {
        LazyError::Endpoint(_) | LazyError::Repo(_) => failure("invalid", e.to_string()),
        _ => failure("io", e.to_string()),
    })?;
    let entry = lazy
        .catalog
        .repos()
        .map_err(|e| store_failure(&e))?
        .into_iter()
        .find(|e| e.repo.name.eq_ignore_ascii_case(name));
    let Some(entry) = entry else {
        // Absent, or at an endpoint that did not answer within the start-up wait.
        if lazy.catalog.reachable() != Some(true) {
            return Err(failure(
                "network",
                format!("{endpoint} did not answer for {name} (is it up, and the URL right?)"),
            ));
        }
        return Err(resolve_failure(&ResolveError::NoRepo {
            name: name.to_owned(),
            place: endpoint.to_owned(),
        }));
    };
    let lane_label = |commit: &ObjectRef| {
        lazy.catalog
            .commit_lane(commit)
            .map(|l| l.lane)
            .map_err(|e| ResolveError::Source(e.to_string()))
    };
    let targets = revisions::resolve_in(&entry.repo, reference, lane, lane_label)
        .map_err(|e| resolve_failure(&e))?;
    let target = revisions::only_lane(reference, targets).map_err(|e| resolve_failure(&e))?;
    // Fetches the commit's tree and header (a release's lanes name commits without them).
    lane_label(&target.commit).map_err(|e| resolve_failure(&e))?;
    let commit = store
        .commit(&target.commit)
        .map_err(|e| store_failure(&e))?;
    Ok((target, commit, lazy.objects))
}

impl Checkpoint {
    fn header(&self) -> &Header {
        &self.commit.header
    }

    fn component(&self, name: &str) -> PyResult<&Component> {
        self.header().component(name).ok_or_else(|| {
            let names: Vec<&str> = self
                .header()
                .components
                .iter()
                .map(|c| c.name.as_str())
                .collect();
            failure(
                "not_found",
                format!(
                    "{}: no component {name:?} (it has: {})",
                    self.label(),
                    names.join(", ")
                ),
            )
        })
    }

    fn tensor<'a>(&self, component: &'a Component, key: &str) -> PyResult<&'a Tensor> {
        component
            .tensors
            .iter()
            .find(|t| t.key == key)
            .ok_or_else(|| {
                failure(
                    "not_found",
                    format!(
                        "{}: component {} has no tensor {key:?}",
                        self.label(),
                        component.name
                    ),
                )
            })
    }

    /// How errors name this checkpoint: `org/name lane (sha256:…)`.
    fn label(&self) -> String {
        match &self.repo {
            Some(repo) => format!("{repo} {} ({})", self.lane, self.commit.id.id()),
            None => self.commit.id.id(),
        }
    }

    /// The bytes at `location`, from the store's blobs, proven as they are read.
    fn bytes(&self, py: Python<'_>, location: Location, what: &str) -> PyResult<Bytes> {
        let mut bytes = Bytes::zeroed(location.length as usize);
        let header = self.header();
        let pieces: Vec<(usize, u64, u64)> = header.pieces(location).collect();
        let mut reads = Vec::with_capacity(pieces.len());
        let mut rest = bytes.as_mut_slice();
        for &(chunk, offset, length) in &pieces {
            let (head, tail) = rest.split_at_mut(length as usize);
            reads.push(ObjectRead {
                object: &header.chunks[chunk],
                offset,
                buf: head,
            });
            rest = tail;
        }
        crate::detached(py, || self.reader.read_objects(&mut reads))
            .map_err(|e| read_failure(what, &e, self.remote))?;
        Ok(bytes)
    }

    /// The array at `location`: in host memory (`device` `None`), or on CUDA device `device`.
    fn array(
        &self,
        py: Python<'_>,
        dtype: &Dtype,
        shape: &[u64],
        location: Location,
        what: &str,
        device: Option<usize>,
    ) -> PyResult<Array> {
        let storage = match device {
            None => Storage::Host(self.bytes(py, location, what)?),
            Some(ordinal) => self.device_bytes(py, location, what, ordinal)?,
        };
        Ok(Array::of(dtype.clone(), shape.to_vec(), storage))
    }

    /// `bytes` (host memory) as an array in host memory, or copied to CUDA device `device`.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn place(
        &self,
        py: Python<'_>,
        dtype: &Dtype,
        shape: &[u64],
        bytes: Bytes,
        what: &str,
        device: Option<usize>,
    ) -> PyResult<Array> {
        let storage = match device {
            None => Storage::Host(bytes),
            #[cfg(feature = "cuda")]
            Some(ordinal) => upload(py, &bytes, what, ordinal)?,
            #[cfg(not(feature = "cuda"))]
            Some(_) => return Err(no_cuda(what)),
        };
        Ok(Array::of(dtype.clone(), shape.to_vec(), storage))
    }

    /// The bytes at `location` on CUDA device `ordinal`: read from the store's blobs straight
    /// into device memory (`tensorfs::gpu`), each blob proven first; through host memory when a
    /// blob has no local file yet (a remote object not fetched: the read fetches it) or cannot
    /// be proven (the host read says why).
    #[cfg(feature = "cuda")]
    fn device_bytes(
        &self,
        py: Python<'_>,
        location: Location,
        what: &str,
        ordinal: usize,
    ) -> PyResult<Storage> {
        let header = self.header();
        let pieces: Vec<(ObjectRef, u64, u64)> = header
            .pieces(location)
            .map(|(chunk, offset, length)| (header.chunks[chunk], offset, length))
            .collect();
        let proven = crate::detached(py, || {
            let mut seen: Vec<ObjectRef> = Vec::new();
            pieces.iter().all(|(object, _, _)| {
                seen.contains(object) || {
                    seen.push(*object);
                    self.reader.backing_file(object).is_some()
                }
            })
        });
        if !proven {
            let bytes = self.bytes(py, location, what)?;
            return upload(py, &bytes, what, ordinal);
        }
        let located = Located::bytes(&self.label(), what, &self.root, &pieces);
        let tensor = crate::detached(py, || device::with_loader(ordinal, |l| l.load(&located)))
            .map_err(|e| gpu_failure(what, e))?;
        let part = tensor.parts.into_iter().next().expect("one part");
        Ok(Storage::Device(device::DeviceBytes::new(part.data)))
    }

    #[cfg(not(feature = "cuda"))]
    fn device_bytes(
        &self,
        _py: Python<'_>,
        _location: Location,
        what: &str,
        _ordinal: usize,
    ) -> PyResult<Storage> {
        Err(no_cuda(what))
    }
}

/// Host `bytes` copied to CUDA device `ordinal`.
#[cfg(feature = "cuda")]
fn upload(py: Python<'_>, bytes: &Bytes, what: &str, ordinal: usize) -> PyResult<Storage> {
    let slice = crate::detached(py, || {
        device::with_loader(ordinal, |l| l.upload(bytes.as_slice(), what))
    })
    .map_err(|e| gpu_failure(what, e))?;
    Ok(Storage::Device(device::DeviceBytes::new(slice)))
}

/// A load to a device as a `Failure`: `unsupported` when CUDA is not available, else the
/// code of what failed.
#[cfg(feature = "cuda")]
fn gpu_failure(what: &str, e: tensorfs::gpu::GpuError) -> PyErr {
    use tensorfs::extents::stage::StageError;
    use tensorfs::gpu::GpuError;
    let code = match &e {
        GpuError::CudaNotAvailable { .. } => "unsupported",
        GpuError::Stage(StageError::Open { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            "not_found"
        }
        GpuError::Stage(StageError::Eof { .. }) => "integrity",
        _ => "io",
    };
    failure(code, format!("{what}: {e}"))
}

#[cfg(not(feature = "cuda"))]
fn no_cuda(what: &str) -> PyErr {
    failure(
        "unsupported",
        format!("{what}: this build of cozytensors has no CUDA support (the `cuda` feature)"),
    )
}

#[pymethods]
impl Checkpoint {
    /// `(repo or None, release or None, lane, commit id, header id, store root)`.
    fn identity(
        &self,
    ) -> (
        Option<String>,
        Option<String>,
        String,
        String,
        String,
        PathBuf,
    ) {
        (
            self.repo.clone(),
            self.release.clone(),
            self.lane.clone(),
            self.commit.id.id(),
            self.commit.header_ref.id(),
            self.root.clone(),
        )
    }

    /// The header as Python values: `{"pipeline": None | (class, config), "metadata": dict,
    /// "chunks": [(sha256 hex, length)], "components": [(name, class, config, config file, {asset: (sha256, length)},
    /// [(key, dtype, shape, None | (scheme, params), [(role, dtype, shape)])])]}`, classes as
    /// `(library, version, name)`, components and tensors in construction order.
    fn describe<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let header = self.header();
        let out = PyDict::new(py);
        match &header.pipeline {
            None => out.set_item("pipeline", py.None())?,
            Some(p) => out.set_item("pipeline", (class(&p.class), config(py, &p.config)?))?,
        }
        out.set_item("metadata", config(py, &header.metadata)?)?;
        let chunks: Vec<(String, u64)> = header
            .chunks
            .iter()
            .map(|c| (c.sha256.hex(), c.length))
            .collect();
        out.set_item("chunks", chunks)?;
        let components = PyList::empty(py);
        for c in &header.components {
            let assets = PyDict::new(py);
            for (name, object) in &c.assets {
                assets.set_item(name, (object.sha256.hex(), object.length))?;
            }
            let tensors = PyList::empty(py);
            for t in &c.tensors {
                let (encoding, parts) = match &t.body {
                    Body::Plain(_) => (py.None(), PyList::empty(py)),
                    Body::Encoded { encoding, parts } => {
                        let e = &header.encodings[*encoding];
                        let list = PyList::empty(py);
                        for p in parts {
                            list.append((&p.role, p.dtype.name(), &p.shape))?;
                        }
                        (
                            (&e.scheme, config(py, &e.params)?)
                                .into_pyobject(py)?
                                .into_any()
                                .unbind(),
                            list,
                        )
                    }
                };
                tensors.append((&t.key, t.dtype.name(), &t.shape, encoding, parts))?;
            }
            components.append((
                &c.name,
                class(&c.class),
                config(py, &c.config)?,
                c.config_name(),
                assets,
                tensors,
            ))?;
        }
        out.set_item("components", components)?;
        Ok(out)
    }

    /// The tensor `key` of `component`: an [`Array`] of its logical bytes when it is plain or
    /// `decode` is true (decoded by the scheme's decoder), else `(scheme, params,
    /// [(role, Array)])`, its parts as stored. `device`: `None` for host memory, else the
    /// ordinal of the CUDA device the arrays are loaded to (a decoded tensor is decoded on the
    /// host, then copied).
    ///
    /// # Errors
    /// `Failure` `not_found` (no such component or tensor, an absent blob), `integrity` (a
    /// damaged blob), `unknown_scheme` or `decode` (with `decode`), `unsupported` (a device
    /// without CUDA), `io`.
    #[pyo3(signature = (component, key, decode=false, device=None))]
    fn read(
        &self,
        py: Python<'_>,
        component: &str,
        key: &str,
        decode: bool,
        device: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let c = self.component(component)?;
        let t = self.tensor(c, key)?;
        let what = format!("{}: {}/{}", self.label(), c.name, t.key);
        match &t.body {
            Body::Plain(location) => Ok(self
                .array(py, &t.dtype, &t.shape, *location, &what, device)?
                .into_pyobject(py)?
                .into_any()
                .unbind()),
            Body::Encoded { encoding, parts } if !decode => {
                let encoding = &self.header().encodings[*encoding];
                let list = PyList::empty(py);
                for p in parts {
                    let what = format!("{what} part {}", p.role);
                    let array = self.array(py, &p.dtype, &p.shape, p.location, &what, device)?;
                    list.append((&p.role, array))?;
                }
                Ok((&encoding.scheme, config(py, &encoding.params)?, list)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind())
            }
            Body::Encoded { encoding, parts } => {
                let encoding = &self.header().encodings[*encoding];
                let mut stored = Vec::with_capacity(parts.len());
                for p in parts {
                    let what = format!("{what} part {}", p.role);
                    stored.push(self.bytes(py, p.location, &what)?);
                }
                let tensor = decode::Encoded {
                    scheme: &encoding.scheme,
                    params: &encoding.params,
                    dtype: &t.dtype,
                    shape: &t.shape,
                    parts: parts
                        .iter()
                        .zip(&stored)
                        .map(|(p, bytes)| decode::Part {
                            role: &p.role,
                            dtype: &p.dtype,
                            shape: &p.shape,
                            bytes: bytes.as_slice(),
                        })
                        .collect(),
                };
                let size = decode::Logical::of(&t.dtype).map(|l| l.size()).unwrap_or(0);
                let elements: u64 = t.shape.iter().product();
                let mut out = Bytes::zeroed((elements as usize).saturating_mul(size));
                crate::detached(py, || decode::decode(&tensor, out.as_mut_slice())).map_err(
                    |e| {
                        let code = match e {
                            decode::DecodeError::UnknownScheme(_) => "unknown_scheme",
                            _ => "decode",
                        };
                        failure(code, format!("{what}: {e}"))
                    },
                )?;
                Ok(self
                    .place(py, &t.dtype, &t.shape, out, &what, device)?
                    .into_pyobject(py)?
                    .into_any()
                    .unbind())
            }
        }
    }

    /// The bytes of asset `name` of `component`, proven.
    ///
    /// # Errors
    /// `Failure` `not_found` (no such component or asset), `integrity`, `io`.
    fn asset<'py>(
        &self,
        py: Python<'py>,
        component: &str,
        name: &str,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.component(component)?;
        let object: ObjectRef = *c.assets.get(name).ok_or_else(|| {
            let names: Vec<&str> = c.assets.keys().map(String::as_str).collect();
            failure(
                "not_found",
                format!(
                    "{}: component {} has no asset {name:?} (it has: {})",
                    self.label(),
                    c.name,
                    names.join(", ")
                ),
            )
        })?;
        let what = format!("{}: {}/{name}", self.label(), c.name);
        let mut buf = vec![0u8; object.length as usize];
        crate::detached(py, || self.reader.read_object(&object, 0, &mut buf))
            .map_err(|e| read_failure(&what, &e, self.remote))?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Releases the hold on this commit's objects, and the descriptors the reader keeps of
    /// its chunks' blobs (a later collection may then sweep them if no ref keeps them);
    /// arrays already read stay valid, and a later read opens its blobs again.
    fn close(&self) {
        self.release();
    }
}

impl Checkpoint {
    fn release(&self) {
        self.hold.lock().unwrap_or_else(|p| p.into_inner()).take();
        let chunks: Vec<_> = self.commit.header.objects().map(|o| o.sha256).collect();
        self.reader.close(&chunks);
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        self.release();
    }
}

fn class(c: &tensorfs::format::ClassRef) -> (String, String, String) {
    (c.library.clone(), c.version.clone(), c.name.clone())
}

fn config<'py>(
    py: Python<'py>,
    config: &std::collections::BTreeMap<String, Value>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (k, v) in config {
        out.set_item(k, value(py, v)?)?;
    }
    Ok(out)
}

/// A header value as Python's: integers, text, bytes, lists, dicts, bools, None, floats.
fn value<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Uint(n) => n.into_pyobject(py)?.into_any(),
        // CBOR's negative integers store −1 − n.
        Value::Nint(n) => (-1 - i128::from(*n)).into_pyobject(py)?.into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::Text(t) => t.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(value(py, item)?)?;
            }
            list.into_any()
        }
        Value::Map(entries) => {
            let dict = PyDict::new(py);
            for (k, item) in entries {
                dict.set_item(k, value(py, item)?)?;
            }
            dict.into_any()
        }
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Null => py.None().into_bound(py),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
    })
}

#[cfg(test)]
mod tests {
    use super::read_code;
    use std::io::ErrorKind;

    #[test]
    fn a_failed_transfer_is_a_network_failure_and_a_local_fault_is_not() {
        // A transfer that made no progress within the deadline, or got a final answer.
        assert_eq!(read_code(ErrorKind::TimedOut, true), "network");
        assert_eq!(read_code(ErrorKind::Other, true), "network");
        assert_eq!(read_code(ErrorKind::Other, false), "io");
        for remote in [false, true] {
            assert_eq!(read_code(ErrorKind::InvalidData, remote), "integrity");
            assert_eq!(read_code(ErrorKind::NotFound, remote), "not_found");
            assert_eq!(read_code(ErrorKind::PermissionDenied, remote), "io");
        }
    }
}
