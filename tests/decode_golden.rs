//! Golden vectors: every fixture under `tests/data/decode/` decodes bit for bit to the outputs
//! its oracle produced (the reference implementation's `raw.decode_into`, or a producer
//! library), or is refused when the oracle refused it.
//!
//! A fixture is one JSON file:
//! ```json
//! {"scheme": "int8.rowwise", "params": {}, "shape": [2, 4],
//!  "parts": [{"role": "weight", "dtype": "I8", "shape": [2, 4], "hex": "01fe..."}],
//!  "outputs": {"F32": "<hex>", "BF16": "<hex>", "F16": "<hex>"},
//!  "refuse": null, "oracle": "tensorfs 0.17.2 raw.decode_into"}
//! ```
//! `refuse`, when a string, is a fragment our refusal must contain; `outputs` is then empty,
//! and the refusal is tried with the logical dtype `dtype` when the fixture gives one, else F32.

use std::fs;
use std::path::{Path, PathBuf};

use tensorfs::decode::{decode, prepare, Encoded, Part};
use tensorfs::format::json::{self, Json};
use tensorfs::format::{Config, Dtype, Value};

fn fixtures(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            fixtures(&path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
}

fn field<'a>(fields: &'a [(String, Json)], name: &str) -> &'a Json {
    &fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("fixture lacks {name:?}"))
        .1
}

fn text(j: &Json) -> &str {
    match j {
        Json::Text(t) => t,
        other => panic!("expected text, found {other:?}"),
    }
}

fn shape(j: &Json) -> Vec<u64> {
    match j {
        Json::Array(items) => items
            .iter()
            .map(|i| match i {
                Json::Uint(n) => *n,
                other => panic!("a shape extent {other:?}"),
            })
            .collect(),
        other => panic!("a shape {other:?}"),
    }
}

struct Case {
    scheme: String,
    params: Config,
    shape: Vec<u64>,
    parts: Vec<(String, Dtype, Vec<u64>, Vec<u8>)>,
    outputs: Vec<(Dtype, Vec<u8>)>,
    refuse: Option<String>,
    /// The logical dtype a refusal is tried with (F32 unless the fixture says).
    dtype: Option<Dtype>,
}

fn load(path: &Path) -> Case {
    let Json::Object(fields) = json::parse(&fs::read(path).unwrap()).unwrap() else {
        panic!("{}: not an object", path.display())
    };
    let params = match json::to_value(field(&fields, "params")) {
        Value::Map(entries) => entries.into_iter().collect(),
        other => panic!("params {other:?}"),
    };
    let Json::Array(parts) = field(&fields, "parts") else {
        panic!("parts")
    };
    let parts = parts
        .iter()
        .map(|p| {
            let Json::Object(p) = p else { panic!("a part") };
            (
                text(field(p, "role")).to_owned(),
                Dtype::parse(text(field(p, "dtype"))).unwrap(),
                shape(field(p, "shape")),
                hex::decode(text(field(p, "hex"))).unwrap(),
            )
        })
        .collect();
    let outputs = match field(&fields, "outputs") {
        Json::Object(o) => o
            .iter()
            .map(|(dtype, hexed)| {
                (
                    Dtype::parse(dtype).unwrap(),
                    hex::decode(text(hexed)).unwrap(),
                )
            })
            .collect(),
        other => panic!("outputs {other:?}"),
    };
    let refuse = match fields.iter().find(|(k, _)| k == "refuse").map(|(_, v)| v) {
        Some(Json::Text(t)) => Some(t.clone()),
        _ => None,
    };
    let dtype = fields
        .iter()
        .find(|(k, _)| k == "dtype")
        .map(|(_, v)| Dtype::parse(text(v)).unwrap());
    Case {
        dtype,
        scheme: text(field(&fields, "scheme")).to_owned(),
        params,
        shape: shape(field(&fields, "shape")),
        parts,
        outputs,
        refuse,
    }
}

/// The first differing element of two outputs, for the failure message.
fn first_difference(got: &[u8], want: &[u8], size: usize) -> String {
    let i = got
        .chunks(size)
        .zip(want.chunks(size))
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    format!(
        "element {i}: got {} want {}",
        hex::encode(&got[i * size..(i + 1) * size]),
        hex::encode(&want[i * size..(i + 1) * size])
    )
}

#[test]
fn every_fixture_decodes_bit_for_bit_or_is_refused() {
    let mut paths = Vec::new();
    fixtures(Path::new("tests/data/decode"), &mut paths);
    paths.sort();
    let mut failures = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for path in &paths {
        let case = load(path);
        if case.refuse.is_none() {
            covered.insert(case.scheme.clone());
        }
        let parts: Vec<Part> = case
            .parts
            .iter()
            .map(|(role, dtype, shape, bytes)| Part {
                role,
                dtype,
                shape,
                bytes,
            })
            .collect();
        let dtypes: Vec<Dtype> = match &case.refuse {
            Some(_) => vec![case.dtype.clone().unwrap_or(Dtype::F32)],
            None => case.outputs.iter().map(|(d, _)| d.clone()).collect(),
        };
        for dtype in dtypes {
            let tensor = Encoded {
                scheme: &case.scheme,
                params: &case.params,
                dtype: &dtype,
                shape: &case.shape,
                parts: parts.clone(),
            };
            match (&case.refuse, prepare(&tensor)) {
                // A value can refuse while decoding, after every check of prepare passed.
                (Some(fragment), Ok(_)) => {
                    let size = tensor.shape.iter().product::<u64>()
                        * dtype.bits().unwrap_or(32) as u64
                        / 8;
                    match decode(&tensor, &mut vec![0u8; size as usize]) {
                        Ok(()) => failures.push(format!(
                            "{}: accepted; the oracle refused ({fragment})",
                            path.display()
                        )),
                        Err(e) if !e.to_string().contains(fragment.as_str()) => {
                            failures.push(format!(
                                "{}: refused with {e:?}, which lacks {fragment:?}",
                                path.display()
                            ))
                        }
                        Err(_) => {}
                    }
                }
                (Some(fragment), Err(e)) if !e.to_string().contains(fragment.as_str()) => failures
                    .push(format!(
                        "{}: refused with {e:?}, which lacks {fragment:?}",
                        path.display()
                    )),
                (Some(_), Err(_)) => {}
                (None, Err(e)) => {
                    failures.push(format!("{} {dtype}: refused: {e}", path.display()))
                }
                (None, Ok(_)) => {
                    let want = &case.outputs.iter().find(|(d, _)| *d == dtype).unwrap().1;
                    let mut got = vec![0u8; want.len()];
                    match decode(&tensor, &mut got) {
                        Err(e) => failures.push(format!("{} {dtype}: {e}", path.display())),
                        Ok(()) if got != *want => failures.push(format!(
                            "{} {dtype}: differs at {}",
                            path.display(),
                            first_difference(&got, want, dtype.bits().unwrap() as usize / 8)
                        )),
                        Ok(()) => {}
                    }
                }
            }
        }
    }
    for scheme in tensorfs::decode::SCHEMES
        .iter()
        .flat_map(|family| family.iter())
    {
        if !covered.contains(scheme.name) {
            failures.push(format!("{}: no fixture decodes it", scheme.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures over {} fixtures:\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n")
    );
}
