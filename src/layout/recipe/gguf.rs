//! A GGUF file's recipe entry: its header as structured metadata, and its plan.
//!
//! ```text
//! {"component": "<name>", "size": <the file's length>,
//!  "gguf": {"version": 3,
//!           "kv": [["<key>", <type>, <value>], …],
//!           "tensors": [["<name>", [ne0, ne1, …], <ggml type>, <offset>], …]},
//!  "arrays": {"<tensor>": {"tensor": "<key>", "role": "<role>"}, …}}
//! ```
//!
//! `type` is GGUF's value type code. A value is an integer for the integer types, the IEEE-754
//! bits of an `f32` (6) or `f64` (12) as an unsigned integer (so NaN payloads and −0 survive),
//! `true`/`false`, text, or for an array (9) `[<element type>, [<element>, …]]`, whose
//! elements are values of that type (an array's elements are such pairs too). Metadata holds
//! no floats or byte strings (spec §9), so this is the whole header in its value domain.
//!
//! The file is [`gguf::write_unpadded`] of that header, then zeros, each tensor's bytes at
//! `data_start + offset`, and zeros up to `size`. A tensor's bytes are the component's tensor
//! of its name (a plain tensor's, or an encoded tensor's `blocks` part), unless `arrays` names
//! another part (`gguf.nvfp4`'s `scale` and `input_scale`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::super::plan::PlanBuilder;
use super::ArraySource;
use crate::format::gguf::{self, Gguf, KvArray, KvType, KvValue, TensorInfo};
use crate::format::{Body, Header, ObjectRef, Tensor, Value};

/// The `gguf` field of a recipe entry.
pub(super) fn to_value(g: &Gguf) -> Value {
    let kv =
        g.kv.iter()
            .map(|(key, value)| {
                Value::Array(vec![
                    Value::Text(key.clone()),
                    Value::Uint(u64::from(value.kind().code())),
                    value_of(value),
                ])
            })
            .collect();
    let tensors = g
        .tensors
        .iter()
        .map(|t| {
            Value::Array(vec![
                Value::Text(t.name.clone()),
                Value::Array(t.ne.iter().map(|e| Value::Uint(*e)).collect()),
                Value::Uint(u64::from(t.ggml_type)),
                Value::Uint(t.offset),
            ])
        })
        .collect();
    Value::map([
        ("version".to_owned(), Value::Uint(u64::from(g.version))),
        ("kv".to_owned(), Value::Array(kv)),
        ("tensors".to_owned(), Value::Array(tensors)),
    ])
}

fn int(v: i64) -> Value {
    match u64::try_from(v) {
        Ok(u) => Value::Uint(u),
        Err(_) => Value::Nint(!v as u64),
    }
}

fn value_of(v: &KvValue) -> Value {
    match v {
        KvValue::U8(x) => Value::Uint(u64::from(*x)),
        KvValue::I8(x) => int(i64::from(*x)),
        KvValue::U16(x) => Value::Uint(u64::from(*x)),
        KvValue::I16(x) => int(i64::from(*x)),
        KvValue::U32(x) | KvValue::F32(x) => Value::Uint(u64::from(*x)),
        KvValue::I32(x) => int(i64::from(*x)),
        KvValue::Bool(b) => Value::Bool(*b),
        KvValue::String(s) => Value::Text(s.clone()),
        KvValue::Array(a) => array_of(a),
        KvValue::U64(x) | KvValue::F64(x) => Value::Uint(*x),
        KvValue::I64(x) => int(*x),
    }
}

fn array_of(a: &KvArray) -> Value {
    let uints = |v: &mut dyn Iterator<Item = u64>| v.map(Value::Uint).collect();
    let items: Vec<Value> = match a {
        KvArray::U8(v) => uints(&mut v.iter().map(|x| u64::from(*x))),
        KvArray::I8(v) => v.iter().map(|x| int(i64::from(*x))).collect(),
        KvArray::U16(v) => uints(&mut v.iter().map(|x| u64::from(*x))),
        KvArray::I16(v) => v.iter().map(|x| int(i64::from(*x))).collect(),
        KvArray::U32(v) | KvArray::F32(v) => uints(&mut v.iter().map(|x| u64::from(*x))),
        KvArray::I32(v) => v.iter().map(|x| int(i64::from(*x))).collect(),
        KvArray::Bool(v) => v.iter().map(|b| Value::Bool(*b)).collect(),
        KvArray::String(v) => v.iter().map(|s| Value::Text(s.clone())).collect(),
        KvArray::Array(v) => v.iter().map(array_of).collect(),
        KvArray::U64(v) | KvArray::F64(v) => uints(&mut v.iter().copied()),
        KvArray::I64(v) => v.iter().map(|x| int(*x)).collect(),
    };
    Value::Array(vec![
        Value::Uint(u64::from(a.kind().code())),
        Value::Array(items),
    ])
}

/// The header in a recipe entry's `gguf` field.
///
/// # Errors
/// A field missing or of the wrong kind, a type code GGUF does not have, a value outside its
/// type's range; the message says where.
pub(super) fn from_value(v: &Value) -> Result<Gguf, String> {
    let Value::Map(fields) = v else {
        return Err("gguf is not a map".into());
    };
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("gguf has no {name}"))
    };
    if fields.len() != 3 {
        return Err("gguf has fields other than version, kv and tensors".into());
    }
    let version =
        uint(get("version")?, u64::from(u32::MAX)).ok_or("gguf version is not a u32")? as u32;
    let Value::Array(entries) = get("kv")? else {
        return Err("gguf kv is not an array".into());
    };
    let mut kv = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let (key, value) = match entry {
            Value::Array(e) => match e.as_slice() {
                [Value::Text(key), kind, value] => {
                    let kind = kv_type(kind).ok_or_else(|| format!("gguf kv {key:?}: no type"))?;
                    let value = kv_value(kind, value, 0)
                        .map_err(|why| format!("gguf kv {key:?}: {why}"))?;
                    (key.clone(), value)
                }
                _ => return Err(format!("gguf kv #{i} is not [key, type, value]")),
            },
            _ => return Err(format!("gguf kv #{i} is not [key, type, value]")),
        };
        kv.push((key, value));
    }
    let Value::Array(entries) = get("tensors")? else {
        return Err("gguf tensors is not an array".into());
    };
    let mut tensors = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let bad = || format!("gguf tensor #{i} is not [name, ne, type, offset]");
        let Value::Array(e) = entry else {
            return Err(bad());
        };
        let [Value::Text(name), Value::Array(ne), ggml_type, offset] = e.as_slice() else {
            return Err(bad());
        };
        let ne = ne
            .iter()
            .map(|e| uint(e, u64::MAX))
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(bad)?;
        tensors.push(TensorInfo {
            name: name.clone(),
            ne,
            ggml_type: uint(ggml_type, u64::from(u32::MAX)).ok_or_else(bad)? as u32,
            offset: uint(offset, u64::MAX).ok_or_else(bad)?,
        });
    }
    Ok(Gguf {
        version,
        kv,
        tensors,
    })
}

fn uint(v: &Value, max: u64) -> Option<u64> {
    match v {
        Value::Uint(n) if *n <= max => Some(*n),
        _ => None,
    }
}

fn kv_type(v: &Value) -> Option<KvType> {
    KvType::from_code(u32::try_from(uint(v, u64::from(u32::MAX))?).ok()?)
}

/// An integer of `T`'s range.
fn ranged<T: TryFrom<i128>>(v: &Value) -> Result<T, String> {
    v.as_int()
        .and_then(|i| T::try_from(i).ok())
        .ok_or_else(|| format!("{v:?} is not a {}", std::any::type_name::<T>()))
}

fn kv_value(kind: KvType, v: &Value, depth: usize) -> Result<KvValue, String> {
    Ok(match kind {
        KvType::U8 => KvValue::U8(ranged(v)?),
        KvType::I8 => KvValue::I8(ranged(v)?),
        KvType::U16 => KvValue::U16(ranged(v)?),
        KvType::I16 => KvValue::I16(ranged(v)?),
        KvType::U32 => KvValue::U32(ranged(v)?),
        KvType::I32 => KvValue::I32(ranged(v)?),
        KvType::F32 => KvValue::F32(ranged(v)?),
        KvType::Bool => match v {
            Value::Bool(b) => KvValue::Bool(*b),
            _ => return Err(format!("{v:?} is not a bool")),
        },
        KvType::String => match v {
            Value::Text(s) => KvValue::String(s.clone()),
            _ => return Err(format!("{v:?} is not text")),
        },
        KvType::Array => KvValue::Array(kv_array(v, depth + 1)?),
        KvType::U64 => KvValue::U64(ranged(v)?),
        KvType::I64 => KvValue::I64(ranged(v)?),
        KvType::F64 => KvValue::F64(ranged(v)?),
    })
}

fn kv_array(v: &Value, depth: usize) -> Result<KvArray, String> {
    if depth > gguf::MAX_ARRAY_DEPTH {
        return Err(format!(
            "arrays nested deeper than {}",
            gguf::MAX_ARRAY_DEPTH
        ));
    }
    let bad = || "an array is not [element type, [elements]]".to_owned();
    let Value::Array(pair) = v else {
        return Err(bad());
    };
    let [kind, Value::Array(items)] = pair.as_slice() else {
        return Err(bad());
    };
    let kind = kv_type(kind).ok_or_else(bad)?;
    macro_rules! all {
        ($variant:ident, $item:ident) => {
            KvArray::$variant(
                items
                    .iter()
                    .map(|i| match kv_value(KvType::$item, i, depth)? {
                        KvValue::$item(x) => Ok(x),
                        _ => unreachable!("kv_value gives its kind"),
                    })
                    .collect::<Result<_, String>>()?,
            )
        };
    }
    Ok(match kind {
        KvType::U8 => all!(U8, U8),
        KvType::I8 => all!(I8, I8),
        KvType::U16 => all!(U16, U16),
        KvType::I16 => all!(I16, I16),
        KvType::U32 => all!(U32, U32),
        KvType::I32 => all!(I32, I32),
        KvType::F32 => all!(F32, F32),
        KvType::Bool => all!(Bool, Bool),
        KvType::String => all!(String, String),
        KvType::U64 => all!(U64, U64),
        KvType::I64 => all!(I64, I64),
        KvType::F64 => all!(F64, F64),
        KvType::Array => KvArray::Array(
            items
                .iter()
                .map(|i| kv_array(i, depth + 1))
                .collect::<Result<_, String>>()?,
        ),
    })
}

/// The plan of a recorded GGUF file of `size` bytes, and the component's tensors it holds, in
/// data order.
pub(super) fn plan(
    header: &Header,
    chunks: &Arc<[ObjectRef]>,
    g: &Gguf,
    size: u64,
    all: &[Tensor],
    by_key: &HashMap<&str, u32>,
    arrays: &BTreeMap<String, ArraySource>,
) -> Result<(super::super::SafetensorsPlan, Vec<u32>), String> {
    let layout = gguf::layout(g, size).map_err(|e| e.to_string())?;
    let mut builder = PlanBuilder::new(header, chunks, gguf::write_unpadded(g));
    let mut held = Vec::with_capacity(g.tensors.len());
    let mut at = layout.header_len;
    for &i in &layout.order {
        let (info, length) = (&g.tensors[i], layout.lengths[i]);
        let (key, role) = match arrays.get(&info.name) {
            None => (info.name.as_str(), None),
            Some(ArraySource::Part { tensor, role }) => (tensor.as_str(), Some(role.as_str())),
            Some(ArraySource::Bytes(_)) => {
                return Err(format!(
                    "tensor {:?}: a GGUF tensor's bytes are never kept in the recipe",
                    info.name
                ))
            }
            Some(ArraySource::Tensor { .. } | ArraySource::Rows { .. }) => {
                return Err(format!(
                    "tensor {:?}: a GGUF file holds only its own component's tensors",
                    info.name
                ))
            }
        };
        let Some(&index) = by_key.get(key) else {
            return Err(format!("tensor {key:?} is not in the component"));
        };
        if !held.contains(&index) {
            held.push(index);
        }
        let tensor = &all[index as usize];
        let location = match (&tensor.body, role) {
            (Body::Plain(location), None) => {
                let kind = info.kind().map_err(|e| e.to_string())?;
                if kind.dtype().as_ref() != Some(&tensor.dtype) {
                    return Err(format!(
                        "tensor {key:?} is {} in the header, ggml {} in the file",
                        tensor.dtype, kind.name
                    ));
                }
                *location
            }
            (Body::Plain(_), Some(role)) => {
                return Err(format!("tensor {key:?} is plain, it has no part {role:?}"))
            }
            (Body::Encoded { parts, .. }, role) => {
                let role = role.unwrap_or("blocks");
                parts
                    .iter()
                    .find(|p| p.role == role)
                    .ok_or_else(|| format!("tensor {key:?} has no part {role:?}"))?
                    .location
            }
        };
        if location.length != length {
            return Err(format!(
                "tensor {:?} is {length} bytes in the file, {} in the header",
                info.name, location.length
            ));
        }
        if length == 0 {
            continue;
        }
        let start = layout.data_start + info.offset;
        builder.push_zeros(start - at);
        builder.push(location);
        at = start + length;
    }
    builder.push_zeros(size - at);
    Ok((builder.finish(), held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Gguf {
        Gguf {
            version: 2,
            kv: vec![
                ("u8".into(), KvValue::U8(255)),
                ("i8".into(), KvValue::I8(-128)),
                ("u16".into(), KvValue::U16(65535)),
                ("i16".into(), KvValue::I16(-32768)),
                ("u32".into(), KvValue::U32(u32::MAX)),
                ("i32".into(), KvValue::I32(i32::MIN)),
                ("nan".into(), KvValue::F32(0x7fc0_0001)),
                ("neg0".into(), KvValue::F64(1 << 63)),
                ("b".into(), KvValue::Bool(false)),
                ("s".into(), KvValue::String("ü\0x".into())),
                ("u64".into(), KvValue::U64(u64::MAX)),
                ("i64".into(), KvValue::I64(i64::MIN)),
                (
                    "nested".into(),
                    KvValue::Array(KvArray::Array(vec![
                        KvArray::F32(vec![(-0.0f32).to_bits(), f32::NAN.to_bits()]),
                        KvArray::String(vec!["a".into()]),
                        KvArray::I64(vec![]),
                    ])),
                ),
            ],
            tensors: vec![TensorInfo {
                name: "w".into(),
                ne: vec![32, 2],
                ggml_type: 8,
                offset: 0,
            }],
        }
    }

    #[test]
    fn a_header_survives_metadata_exactly() {
        let g = sample();
        let v = to_value(&g);
        assert_eq!(from_value(&v).unwrap(), g);
        // Through CBOR bytes, as a header stores it.
        let bytes = crate::format::cbor::encode(&v).unwrap();
        let back = crate::format::cbor::decode(&bytes).unwrap();
        assert_eq!(from_value(&back).unwrap(), g);
    }

    #[test]
    fn values_outside_their_type_are_refused() {
        let entry = |kind: u64, value: Value| {
            Value::map([
                ("version".to_owned(), Value::Uint(3)),
                (
                    "kv".to_owned(),
                    Value::Array(vec![Value::Array(vec![
                        Value::Text("k".into()),
                        Value::Uint(kind),
                        value,
                    ])]),
                ),
                ("tensors".to_owned(), Value::Array(vec![])),
            ])
        };
        assert!(from_value(&entry(0, Value::Uint(256))).is_err());
        assert!(from_value(&entry(1, Value::Nint(128))).is_err());
        assert!(from_value(&entry(1, Value::Nint(127))).is_ok());
        assert!(from_value(&entry(6, Value::Uint(1 << 32))).is_err());
        assert!(from_value(&entry(7, Value::Uint(1))).is_err());
        assert!(from_value(&entry(8, Value::Uint(1))).is_err());
        assert!(from_value(&entry(13, Value::Uint(1))).is_err());
        let m = from_value(&entry(9, Value::Array(vec![Value::Uint(0)]))).unwrap_err();
        assert!(m.contains("\"k\"") && m.contains("element type"), "{m}");
        let ok = Value::Array(vec![
            Value::Uint(0),
            Value::Array(vec![Value::Uint(1), Value::Uint(2)]),
        ]);
        assert!(from_value(&entry(9, ok)).is_ok());
    }
}
