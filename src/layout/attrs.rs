//! Extended attributes of a lane's folders and files: what the header says about them, for
//! any tool (`getfattr -d`, Python's `os.getxattr`). Documented in `docs/xattrs.md`.
//!
//! Values are UTF-8: ids as `sha256:<hex>`, everything else canonical JSON. A weights file can
//! hold more tensors than one attribute value (64 KiB) or the name list can show, so its tensor
//! keys are paged: `user.tensorfs.tensors` says how many and in how many pages, each page
//! `user.tensorfs.tensors.<p>` (listed) is a JSON array of at most [`PAGE_BYTES`] bytes, and
//! `user.tensorfs.tensor.<key>` or `user.tensorfs.tensor.#<i>` (not listed: there may be
//! thousands) describes one tensor: dtype, shape, and for an encoded tensor its scheme, params
//! and parts.

use serde_json::{json, Value as J};

use super::{LaneFile, LaneView, Owner};
use crate::format::json as fjson;
use crate::format::{Body, ClassRef, Config, Tensor, Value};

/// The commit id of every lane folder, subfolder and file.
pub const COMMIT: &str = "user.tensorfs.commit";
/// The header id of every lane folder, subfolder and file.
pub const HEADER: &str = "user.tensorfs.header";
/// The pipeline's class, on the lane folder of a model with a pipeline.
pub const PIPELINE: &str = "user.tensorfs.pipeline";
/// The component's name, on its folder and files.
pub const COMPONENT: &str = "user.tensorfs.component";
/// The component's class `[library, version, name]`, on its folder and files.
pub const CLASS: &str = "user.tensorfs.class";
/// `{"count": n, "pages": p}` on a weights file.
pub const TENSORS: &str = "user.tensorfs.tensors";
/// Prefix of a page of tensor keys (`user.tensorfs.tensors.0`).
pub const TENSORS_PAGE: &str = "user.tensorfs.tensors.";
/// Prefix of one tensor's description, by key or by `#<index>` in the pages' order.
pub const TENSOR: &str = "user.tensorfs.tensor.";
/// Where a synthesized file's view stands (`ready`, `building`, `absent`), on a mount with
/// views ([`crate::views`]).
pub const VIEW: &str = "user.tensorfs.view";
/// Most bytes of one page of tensor keys.
pub const PAGE_BYTES: usize = 32 << 10;

/// A folder (its path in the lane, `""` for the lane folder) or a file.
#[derive(Clone, Copy, Debug)]
pub enum Item<'a> {
    /// A folder.
    Folder(&'a str),
    /// A file.
    File(&'a LaneFile),
}

/// The component a folder or file belongs to.
fn component(view: &LaneView, item: Item<'_>) -> Option<usize> {
    match item {
        Item::File(file) => match file.owner {
            Owner::Component { index, .. } => Some(index),
            _ => None,
        },
        Item::Folder(path) => {
            let folder = if path.is_empty() {
                String::new()
            } else {
                format!("{path}/")
            };
            view.folders.iter().position(|f| *f == folder)
        }
    }
}

/// The tensors a weights file holds.
fn tensors<'v>(view: &'v LaneView, item: Item<'_>) -> Option<(usize, &'v [Tensor], Vec<u32>)> {
    let Item::File(LaneFile {
        owner: Owner::Component { index, tensors },
        ..
    }) = item
    else {
        return None;
    };
    (!tensors.is_empty()).then(|| {
        (
            *index,
            &view.header.components[*index].tensors[..],
            tensors.clone(),
        )
    })
}

/// The names `listxattr` shows for `item`.
pub fn names(view: &LaneView, item: Item<'_>) -> Vec<String> {
    let mut names = vec![COMMIT.to_owned(), HEADER.to_owned()];
    if matches!(item, Item::Folder("")) && view.header.pipeline.is_some() {
        names.push(PIPELINE.to_owned());
    }
    if component(view, item).is_some() {
        names.push(COMPONENT.to_owned());
        names.push(CLASS.to_owned());
    }
    if let Some((_, all, held)) = tensors(view, item) {
        names.push(TENSORS.to_owned());
        for p in 0..pages(all, &held).len() {
            names.push(format!("{TENSORS_PAGE}{p}"));
        }
    }
    names
}

/// The value of attribute `name` of `item`, if it has one.
pub fn value(view: &LaneView, item: Item<'_>, name: &str) -> Option<Vec<u8>> {
    let text = match name {
        COMMIT => view.commit.id(),
        HEADER => view.header_ref.id(),
        PIPELINE if matches!(item, Item::Folder("")) => {
            class(&view.header.pipeline.as_ref()?.class)
        }
        COMPONENT => view.header.components[component(view, item)?].name.clone(),
        CLASS => class(&view.header.components[component(view, item)?].class),
        TENSORS => {
            let (_, all, held) = tensors(view, item)?;
            json!({"count": held.len(), "pages": pages(all, &held).len()}).to_string()
        }
        _ => {
            let (c, all, held) = tensors(view, item)?;
            if let Some(page) = name.strip_prefix(TENSORS_PAGE) {
                let page: usize = page.parse().ok()?;
                let range = pages(all, &held).get(page)?.clone();
                let keys: Vec<&str> = held[range]
                    .iter()
                    .map(|&i| all[i as usize].key.as_str())
                    .collect();
                serde_json::to_string(&keys).expect("strings serialize")
            } else {
                let wanted = name.strip_prefix(TENSOR)?;
                let index = match wanted.strip_prefix('#') {
                    Some(i) => *held.get(i.parse::<usize>().ok()?)?,
                    None => *held.iter().find(|&&i| all[i as usize].key == wanted)?,
                };
                describe(view, c, &all[index as usize]).to_string()
            }
        }
    };
    Some(text.into_bytes())
}

/// `[library, version, name]` as JSON.
fn class(class: &ClassRef) -> String {
    json!([class.library, class.version, class.name]).to_string()
}

/// The held tensors split into pages of key lists of at most [`PAGE_BYTES`] of JSON.
fn pages(all: &[Tensor], held: &[u32]) -> Vec<std::ops::Range<usize>> {
    let mut pages = Vec::new();
    let (mut start, mut bytes) = (0, 2);
    for (i, &t) in held.iter().enumerate() {
        let size = serde_json::to_string(&all[t as usize].key)
            .expect("strings serialize")
            .len()
            + 1;
        if i > start && bytes + size > PAGE_BYTES {
            pages.push(start..i);
            (start, bytes) = (i, 2);
        }
        bytes += size;
    }
    if start < held.len() {
        pages.push(start..held.len());
    }
    pages
}

/// One tensor: dtype and shape, and for an encoded one its scheme, params and parts.
fn describe(view: &LaneView, _component: usize, t: &Tensor) -> J {
    match &t.body {
        Body::Plain(_) => json!({"key": t.key, "dtype": t.dtype.name(), "shape": t.shape}),
        Body::Encoded { encoding, parts } => {
            let e = &view.header.encodings[*encoding];
            json!({
                "key": t.key,
                "dtype": t.dtype.name(),
                "shape": t.shape,
                "scheme": e.scheme,
                "params": params(&e.params),
                "parts": parts.iter().map(|p| json!({"role": p.role, "dtype": p.dtype.name(), "shape": p.shape})).collect::<Vec<_>>(),
            })
        }
    }
}

/// Params as JSON (their value domain has no floats or null).
fn params(params: &Config) -> J {
    let value = Value::map(params.iter().map(|(k, v)| (k.clone(), v.clone())));
    fjson::canonical(&fjson::from_value(&value))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(J::Null)
}
