//! Values a convention reads: its literal params, the declaring config (dotted paths), the
//! module's marker document, and facts of the module (parts present, logical columns).

use std::collections::{BTreeMap, BTreeSet};

use super::table::{Convention, Declaration, Expr, Keys};
use crate::format::json::{self, Json};

/// Values read by a convention: the module's marker document, the declaring config.
pub(super) struct Lookup<'a> {
    pub(super) marker: Option<&'a Json>,
    pub(super) config: Option<&'a Json>,
    pub(super) roles: &'a BTreeSet<&'a str>,
    pub(super) columns: Option<u64>,
}

impl Lookup<'_> {
    pub(super) fn eval(&self, expr: &Expr) -> Result<Json, String> {
        match expr {
            Expr::Literal(v) => Ok(from_serde(v)),
            Expr::HasPart { has_part } => Ok(Json::Bool(self.roles.contains(has_part.as_str()))),
            Expr::Logical { logical } if logical == "columns" => self
                .columns
                .map(Json::Uint)
                .ok_or_else(|| "the logical shape has no columns".into()),
            Expr::Logical { logical } => Err(format!("unknown logical value {logical:?}")),
            Expr::Marker { marker, default } => {
                let doc = self.marker.ok_or("no marker document")?;
                match marker_get(doc, marker) {
                    Some(v) => Ok(v.clone()),
                    None => default
                        .as_ref()
                        .map(from_serde)
                        .ok_or_else(|| format!("the marker has no {marker:?}")),
                }
            }
            Expr::Config {
                config,
                map,
                default,
            } => {
                let keys: Vec<&String> = match config {
                    Keys::One(k) => vec![k],
                    Keys::Many(ks) => ks.iter().collect(),
                };
                let mut found = None;
                for k in keys.iter() {
                    let v = self.config_value(k)?;
                    if v != Json::Null {
                        found = Some(v);
                        break;
                    }
                }
                let v = match (found, default) {
                    (Some(v), _) => v,
                    (None, Some(d)) => return Ok(from_serde(d)),
                    (None, None) => {
                        return Err(format!(
                            "the quantization config has no {}",
                            keys.iter()
                                .map(|k| k.as_str())
                                .collect::<Vec<_>>()
                                .join(" or ")
                        ))
                    }
                };
                match map {
                    None => Ok(v),
                    Some(map) => {
                        let key = match &v {
                            Json::Text(t) => t.clone(),
                            other => format!("{}", JsonShow(other)),
                        };
                        map.get(&key).map(from_serde).ok_or_else(|| {
                            format!(
                                "{} is {key:?}, not one of {}",
                                keys[0],
                                map.keys().cloned().collect::<Vec<_>>().join(", ")
                            )
                        })
                    }
                }
            }
            Expr::CtPacking { ct_packing } => {
                let bits = match self.config_value(ct_packing)? {
                    Json::Uint(b) if (1..=8).contains(&b) => b,
                    other => {
                        return Err(format!("{ct_packing} is {}, not 1 to 8", JsonShow(&other)))
                    }
                };
                if 32 % bits == 0 {
                    // Word and dense packing are the same bytes.
                    return Ok(Json::Text("dense".into()));
                }
                // compressed-tensors packs densely from 0.17 on.
                match self.config_value("version")? {
                    Json::Text(v) => {
                        let mut it = v.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
                        let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
                        let dense = major > 0 || minor >= 17;
                        Ok(Json::Text(if dense { "dense" } else { "word" }.into()))
                    }
                    _ => Err(format!(
                        "{bits}-bit codes pack differently before and after compressed-tensors \
                         0.17, and the config states no version"
                    )),
                }
            }
        }
    }

    /// A value of the declaring config by dotted path; `*` takes every entry of an object,
    /// which must agree. `Null` when absent.
    pub(super) fn config_value(&self, path: &str) -> Result<Json, String> {
        let Some(doc) = self.config else {
            return Ok(Json::Null);
        };
        let mut found: Vec<&Json> = vec![doc];
        for segment in path.split('.') {
            let mut next = Vec::new();
            for v in found {
                if segment == "*" {
                    if let Json::Object(entries) = v {
                        next.extend(entries.iter().map(|(_, v)| v));
                    }
                } else if let Some(v) = v.get(segment) {
                    next.push(v);
                }
            }
            found = next;
        }
        match found.as_slice() {
            [] => Ok(Json::Null),
            [first, rest @ ..] => {
                if let Some(other) = rest.iter().find(|v| *v != first) {
                    return Err(format!(
                        "the quantization config's {path} differs between entries ({} and {}); \
                         models quantized with several settings are not supported",
                        JsonShow(first),
                        JsonShow(other)
                    ));
                }
                Ok((*first).clone())
            }
        }
    }
}

/// ComfyUI reads a marker key at the top level, then under `params`.
pub(super) fn marker_get<'a>(doc: &'a Json, key: &str) -> Option<&'a Json> {
    doc.get(key)
        .or_else(|| doc.get("params").and_then(|p| p.get(key)))
}

/// Every key of a ComfyUI marker must be one the convention reads: an unknown key may change
/// the decode (spec §6: params are never ignored).
pub(super) fn check_marker_keys(
    c: &Convention,
    doc: &Json,
    ignored: &[String],
) -> Result<(), String> {
    let mut read: BTreeSet<&str> = BTreeSet::from(["format", "params"]);
    let exprs = c
        .encodings
        .iter()
        .flat_map(|rule| rule.params.values().chain(rule.vars.values()))
        .chain(c.constants.iter().map(|k| &k.value));
    for e in exprs {
        if let Expr::Marker { marker, .. } = e {
            read.insert(marker);
        }
    }
    for d in &c.declared_by {
        match d {
            Declaration::ComfyQuant { with, .. } => {
                read.extend(with.keys().map(String::as_str));
            }
            // bitsandbytes' quant_state states what its arrays are; its keys are checked by
            // the decoder through the values built from them.
            Declaration::State { .. } => return Ok(()),
            _ => {}
        }
    }
    let entries = |j: &Json| match j {
        Json::Object(e) => e.clone(),
        _ => Vec::new(),
    };
    let mut all = entries(doc);
    if let Some(p) = doc.get("params") {
        all.extend(entries(p));
    }
    for (k, v) in all {
        if !read.contains(k.as_str()) && !ignored.contains(&k) {
            return Err(format!(
                "the marker's {k:?} ({}) is not a key TensorFS reads for {}, so its effect on \
                 the decode is unknown",
                JsonShow(&v),
                c.name
            ));
        }
    }
    Ok(())
}

/// Whether `doc` holds, at each dotted path, one of the values (`null` for absent).
pub(super) fn matches_all(
    doc: &Json,
    want: &BTreeMap<String, Vec<serde_json::Value>>,
) -> Result<bool, String> {
    for (path, values) in want {
        let lookup = Lookup {
            marker: None,
            config: Some(doc),
            roles: &BTreeSet::new(),
            columns: None,
        };
        let v = match lookup.config_value(path) {
            Ok(v) => v,
            Err(_) => return Ok(false),
        };
        if !values.iter().any(|w| json_eq(&v, w)) {
            return Ok(false);
        }
    }
    Ok(true)
}

pub(super) fn json_eq(a: &Json, b: &serde_json::Value) -> bool {
    *a == from_serde(b)
}

pub(crate) fn from_serde(v: &serde_json::Value) -> Json {
    match v {
        serde_json::Value::Null => Json::Null,
        serde_json::Value::Bool(b) => Json::Bool(*b),
        serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Json::Uint(u),
            (None, Some(i)) => Json::Int(i),
            _ => Json::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Json::Text(s.clone()),
        serde_json::Value::Array(items) => Json::Array(items.iter().map(from_serde).collect()),
        serde_json::Value::Object(m) => {
            Json::Object(m.iter().map(|(k, v)| (k.clone(), from_serde(v))).collect())
        }
    }
}

/// A JSON value for messages.
pub(super) struct JsonShow<'a>(pub(super) &'a Json);

impl std::fmt::Display for JsonShow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match json::canonical(self.0) {
            Ok(text) => f.write_str(&text),
            Err(_) => write!(f, "{:?}", self.0),
        }
    }
}
