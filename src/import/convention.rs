//! Producer conventions: which arrays of a safetensors source are one encoded tensor.
//!
//! A quantizing producer stores a weight as several arrays (`x.weight` and `x.weight_scale`;
//! GPTQ's `x.qweight`, `x.qzeros`, `x.scales`, `x.g_idx`) and says how they decode somewhere
//! else: a config's `quantization_config`, a `hf_quant_config.json`, ComfyUI's per-layer
//! `x.comfy_quant` document or `scaled_fp8` marker, bitsandbytes' `quant_state` document. The
//! table `fs-layout/conventions.json` (documented in `fs-layout/README.md`) lists, per
//! convention, what declares it, the arrays of a module (by suffix) and the part role each
//! becomes, and the scheme and params (spec §6) it means.
//!
//! [`recognize`] sorts a component's arrays into plain tensors, encoded tensors and markers
//! (arrays that only declare). A module is encoded when its anchor array (the convention's
//! first part) has one of the convention's stored dtypes:
//! - a declared convention must then build, or the import is refused naming the arrays;
//! - an undeclared module with companion arrays is taken only when the table allows the
//!   convention undeclared and every convention whose arrays match agrees on the encoding;
//!   otherwise it is refused as ambiguous, naming the conventions `--converter` accepts.
//!
//! Every candidate encoding is checked by the decoder's own `prepare` (spec §6 refusals:
//! dtypes, shapes, `g_idx` against `act_order`, a `quant_map` against its table), with the
//! real bytes of each part up to [`CHECKED_PART_BYTES`], so an import never stores an encoded
//! tensor that its decode would refuse for its shape or small parts.

use super::scan::SourceTensor;
use crate::decode;
use crate::format::json::{self, Json};
use crate::format::{Config, Dtype, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The safetensors `__metadata__` key where ComfyUI lists its quantized layers
/// (`{"format_version": "1.0", "layers": {module: <a .comfy_quant document>}}`).
const COMFY_METADATA: &str = "_quantization_metadata";

/// Parts up to this size are read from the source to check the encoding; larger ones (weights)
/// are checked by dtype and length only.
pub(crate) const CHECKED_PART_BYTES: u64 = 4 << 20;
/// What one source array becomes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Item {
    /// The array as a plain tensor of its own name.
    Plain(usize),
    /// An encoded tensor, listed where its first array is.
    Encoded(EncodedModel),
    /// An array that only declares a convention; the recipe keeps its bytes.
    Marker(usize),
    /// A plain tensor whose bytes the import computes from the array's: transposed (a single
    /// file's OpenCLIP `text_projection`, which Diffusers holds the other way) or its rows in
    /// another order (an original adaLN projection's halves); its key, dtype and shape are
    /// the array's entry, these its bytes.
    Computed(usize, std::sync::Arc<[u8]>),
}

/// An encoded tensor built from source arrays.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EncodedModel {
    pub key: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub scheme: String,
    pub params: Config,
    pub parts: Vec<PartModel>,
    /// The convention that made it.
    pub convention: String,
}

/// One part of an [`EncodedModel`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PartModel {
    pub role: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub source: PartSource,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PartSource {
    /// A source array (index into the component's tensors), bytes as stored.
    Array(usize),
    /// Bytes the convention states elsewhere (bitsandbytes' `nested_offset`).
    Bytes(Vec<u8>),
}

/// What [`recognize`] needs besides the arrays.
pub(crate) struct Context<'a> {
    /// The component, for messages.
    pub component: &'a str,
    /// The component's config (`quantization_config`, `torch_dtype`).
    pub config: &'a Config,
    /// JSON files of the component folder by name (`hf_quant_config.json`).
    pub files: &'a BTreeMap<String, Json>,
    /// The `__metadata__` of the component's first safetensors file.
    pub metadata: &'a [(String, String)],
    /// A convention the user declared for every module (`--converter`).
    pub converter: Option<&'a str>,
}

/// Reads a source array's bytes (small arrays only: markers and checked parts).
pub(crate) type ReadArray<'a> = dyn Fn(usize) -> Result<Vec<u8>, String> + 'a;

/// Sorts `arrays` into plain tensors, encoded tensors and markers, in array order.
///
/// # Errors
/// A declared convention that does not build, an undeclared or ambiguous module, a marker that
/// cannot be read; the message names the arrays and what is wrong.
pub(crate) fn recognize(
    cx: &Context<'_>,
    arrays: &[SourceTensor],
    read: &ReadArray<'_>,
) -> Result<Vec<Item>, String> {
    let converter = named_convention(cx.converter)?;
    let config_doc = cx.config.get("quantization_config").map(json::from_value);
    let (declared, mut markers) = declared(cx, arrays, config_doc.as_ref(), converter)?;
    let module_docs = module_docs(cx, arrays, read, &mut markers)?;
    let known = Declarations {
        by_name: arrays
            .iter()
            .enumerate()
            .map(|(i, a)| (a.key.as_str(), i))
            .collect(),
        declared,
        module_docs,
        config_doc,
        converter,
    };
    let (encoded, claimed) = encode_modules(cx, arrays, read, &known)?;
    made_as_declared(&known, arrays, &encoded)?;
    items(arrays, &markers, &claimed, &encoded)
}

/// What a component's recognition knows before it reads its modules.
struct Declarations<'a> {
    /// Each array's index by key.
    by_name: HashMap<&'a str, usize>,
    /// Each convention the component declares, with the document that declared it (a config or
    /// file; `None` for a marker, whose convention then reads `config_doc`).
    declared: Vec<Declared>,
    /// Per module, the conventions its own declaration names, the declaration, and where it
    /// is (for messages).
    module_docs: HashMap<String, ModuleDoc>,
    /// The component config's `quantization_config`.
    config_doc: Option<Json>,
    /// The convention `--converter` names.
    converter: Option<&'static Convention>,
}

/// A convention declared for the whole component, with the document that declared it.
type Declared = (&'static Convention, Option<Json>);

/// A module's own declaration: the conventions that read it, the document, and where it is.
type ModuleDoc = (Vec<&'static Convention>, Json, String);

/// The convention `--converter` names, if it names one.
///
/// # Errors
/// The name is neither a convention nor a single-file converter.
fn named_convention(name: Option<&str>) -> Result<Option<&'static Convention>, String> {
    let Some(name) = name else {
        return Ok(None);
    };
    table()
        .conventions
        .iter()
        .find(|c| c.name == name)
        .map(Some)
        .ok_or_else(|| {
            let single: Vec<&str> = crate::layout::convert::table()
                .converters
                .iter()
                .map(|c| c.name.as_str())
                .collect();
            format!(
                "--converter {name:?} is neither a producer convention TensorFS knows ({}) nor \
                 a single-file converter ({})",
                names().join(", "),
                single.join(", ")
            )
        })
}

/// The conventions declared for the whole component (by its quantization config, its files
/// and marker arrays; `--converter` keeps only its own, or declares it), and the marker
/// arrays' indices.
///
/// # Errors
/// A declaration's match cannot be judged.
fn declared(
    cx: &Context<'_>,
    arrays: &[SourceTensor],
    quantization_config: Option<&Json>,
    converter: Option<&'static Convention>,
) -> Result<(Vec<Declared>, BTreeSet<usize>), String> {
    let table = table();
    // Each declared convention, with the document that declared it (a config or file; `None`
    // for a marker, whose convention then reads the component's quantization config).
    let mut declared: Vec<Declared> = Vec::new();
    let mut markers: BTreeSet<usize> = BTreeSet::new();
    for convention in &table.conventions {
        for d in &convention.declared_by {
            match d {
                Declaration::Config { config } => {
                    if let Some(q) = quantization_config {
                        if matches_all(q, config)? {
                            declared.push((convention, Some(q.clone())));
                        }
                    }
                }
                Declaration::File { file, matches } => {
                    if let Some(doc) = cx.files.get(file) {
                        if matches_all(doc, matches)? {
                            declared.push((convention, Some(doc.clone())));
                        }
                    }
                }
                Declaration::Marker { marker } => {
                    let suffix = format!(".{marker}");
                    let found: Vec<usize> = arrays
                        .iter()
                        .enumerate()
                        .filter(|(_, a)| a.key == *marker || a.key.ends_with(&suffix))
                        .map(|(i, _)| i)
                        .collect();
                    if !found.is_empty() {
                        markers.extend(found);
                        declared.push((convention, None));
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(c) = converter {
        declared.retain(|(d, _)| d.name == c.name);
        if declared.is_empty() {
            let doc = quantization_config.cloned();
            declared.push((c, doc));
        }
    }
    Ok((declared, markers))
}

/// Per-module declarations: ComfyUI's `.comfy_quant` arrays and `_quantization_metadata`
/// layers, bitsandbytes' quant_state arrays, each with the conventions that read it; the
/// arrays that declare are added to `markers`.
///
/// # Errors
/// A declaration that cannot be read, is not one TensorFS knows, or declares a module twice.
fn module_docs(
    cx: &Context<'_>,
    arrays: &[SourceTensor],
    read: &ReadArray<'_>,
    markers: &mut BTreeSet<usize>,
) -> Result<HashMap<String, ModuleDoc>, String> {
    let table = table();
    // (module, document, where it is, ComfyUI's?)
    let mut declarations: Vec<(String, Json, String, bool)> = Vec::new();
    for (i, a) in arrays.iter().enumerate() {
        if let Some(module) = a.key.strip_suffix(".comfy_quant") {
            markers.insert(i);
            declarations.push((
                module.to_owned(),
                marker_doc(a, i, read)?,
                a.key.clone(),
                true,
            ));
            continue;
        }
        let states = table.conventions.iter().flat_map(|c| &c.declared_by);
        for d in states {
            if let Declaration::State { state, .. } = d {
                if let Some(at) = a.key.find(state.as_str()).filter(|at| *at > 0) {
                    markers.insert(i);
                    let doc = marker_doc(a, i, read)?;
                    declarations.push((a.key[..at].to_owned(), doc, a.key.clone(), false));
                    break;
                }
            }
        }
    }
    if let Some((_, text)) = cx.metadata.iter().find(|(k, _)| k == COMFY_METADATA) {
        let origin = format!("__metadata__ {COMFY_METADATA}");
        let doc = json::parse_config(text.as_bytes()).map_err(|e| format!("{origin}: {e}"))?;
        match doc.get("format_version") {
            Some(Json::Text(v)) if v == "1.0" => {}
            other => {
                return Err(format!(
                    "{origin}: format_version {} is not 1.0, the one TensorFS reads",
                    other.map_or("(missing)".into(), |v| JsonShow(v).to_string())
                ))
            }
        }
        let Some(Json::Object(layers)) = doc.get("layers") else {
            return Err(format!("{origin}: has no layers object"));
        };
        for (module, layer) in layers {
            let origin = format!("{origin} layer {module:?}");
            declarations.push((module.clone(), layer.clone(), origin, true));
        }
    }
    let mut module_docs: HashMap<String, ModuleDoc> = HashMap::new();
    for (module, doc, origin, comfy) in &declarations {
        if module_docs.contains_key(module) {
            return Err(format!("{origin}: module {module} is declared twice"));
        }
        let format = match (comfy, doc.get("format")) {
            (false, _) => None,
            (true, Some(Json::Text(f))) => Some(f),
            (true, _) => return Err(format!("{origin}: has no \"format\" string")),
        };
        let mut takes = Vec::new();
        for convention in &table.conventions {
            for d in &convention.declared_by {
                let with = match (d, format) {
                    (Declaration::ComfyQuant { comfy_quant, with }, Some(f))
                        if comfy_quant.contains(f) =>
                    {
                        with
                    }
                    (Declaration::State { state, with }, None)
                        if origin.contains(state.as_str()) =>
                    {
                        with
                    }
                    _ => continue,
                };
                if matches_all(doc, with)? {
                    takes.push(convention);
                }
            }
        }
        if takes.is_empty() {
            let known: BTreeSet<&str> = table
                .conventions
                .iter()
                .flat_map(|c| &c.declared_by)
                .filter_map(|d| match d {
                    Declaration::ComfyQuant { comfy_quant, .. } => Some(comfy_quant),
                    _ => None,
                })
                .flatten()
                .map(String::as_str)
                .collect();
            return Err(match format {
                Some(f) => format!(
                    "{origin}: ComfyUI quantization format {f:?} is not one TensorFS knows ({}), \
                     so {module}'s arrays cannot be decoded; pass --converter to declare \
                     another convention",
                    known.into_iter().collect::<Vec<_>>().join(", ")
                ),
                None => format!(
                    "{origin}: no convention reads this document: {}",
                    JsonShow(doc)
                ),
            });
        }
        module_docs.insert(module.clone(), (takes, doc.clone(), origin.clone()));
    }

    Ok(module_docs)
}

/// Every module some convention's anchor array names, encoded: the encoded tensors, and which
/// of them (by index) each array is a part of.
///
/// # Errors
/// A module that cannot be read as declared, a tensor built twice, an array in two tensors.
fn encode_modules(
    cx: &Context<'_>,
    arrays: &[SourceTensor],
    read: &ReadArray<'_>,
    known: &Declarations<'_>,
) -> Result<(Vec<EncodedModel>, HashMap<usize, usize>), String> {
    let table = table();
    let mut claimed: HashMap<usize, usize> = HashMap::new(); // array → encoded index
    let mut encoded: Vec<EncodedModel> = Vec::new();
    let mut modules_seen: BTreeSet<String> = BTreeSet::new();
    for a in arrays.iter() {
        for convention in &table.conventions {
            let anchor = &convention.parts[0];
            let Some(module) = a.key.strip_suffix(anchor.suffix.as_str()) else {
                continue;
            };
            if module.is_empty() || !modules_seen.insert(format!("{module}\u{0}{}", anchor.suffix))
            {
                continue;
            }
            if let Some(model) = module_encoding(cx, module, &anchor.suffix, arrays, read, known)? {
                let index = encoded.len();
                if let Some(other) = encoded.iter().find(|e| e.key == model.key) {
                    return Err(format!(
                        "{} would be built twice, by {} and by {}",
                        model.key, other.convention, model.convention
                    ));
                }
                for part in &model.parts {
                    if let PartSource::Array(i) = part.source {
                        if let Some(other) = claimed.insert(i, index) {
                            return Err(format!(
                                "{} would be a part of both {} and {}",
                                arrays[i].key, encoded[other].key, model.key
                            ));
                        }
                    }
                }
                encoded.push(model);
            }
        }
    }
    Ok((encoded, claimed))
}

/// That each per-module declaration made its tensor.
///
/// # Errors
/// A declared module's anchor is missing or of another dtype than its convention stores.
fn made_as_declared(
    known: &Declarations<'_>,
    arrays: &[SourceTensor],
    encoded: &[EncodedModel],
) -> Result<(), String> {
    for (module, (conventions, _, marker)) in &known.module_docs {
        let made = encoded.iter().any(|e| {
            conventions
                .iter()
                .any(|c| c.name == e.convention && e.key == format!("{module}{}", c.key))
        });
        if !made {
            let wanted: Vec<String> = conventions
                .iter()
                .map(|c| {
                    let anchor = format!("{module}{}", c.parts[0].suffix);
                    match known.by_name.get(anchor.as_str()) {
                        Some(&i) => format!(
                            "{anchor} is {}, not {} as {} stores it",
                            arrays[i].dtype,
                            c.anchor_dtypes.join(" or "),
                            c.name
                        ),
                        None => format!("{anchor} is missing"),
                    }
                })
                .collect();
            return Err(format!(
                "{marker} declares a quantized weight, but {}",
                wanted.join("; ")
            ));
        }
    }
    Ok(())
}

/// The arrays sorted into markers, encoded tensors (once, at their first part) and plain
/// tensors, in array order.
///
/// # Errors
/// A plain array's key is also an encoded tensor's.
fn items(
    arrays: &[SourceTensor],
    markers: &BTreeSet<usize>,
    claimed: &HashMap<usize, usize>,
    encoded: &[EncodedModel],
) -> Result<Vec<Item>, String> {
    let mut items = Vec::with_capacity(arrays.len());
    let mut emitted = vec![false; encoded.len()];
    for (i, a) in arrays.iter().enumerate() {
        if markers.contains(&i) {
            items.push(Item::Marker(i));
        } else if let Some(&e) = claimed.get(&i) {
            if !emitted[e] {
                emitted[e] = true;
                items.push(Item::Encoded(encoded[e].clone()));
            }
        } else {
            if let Some(e) = encoded.iter().find(|e| e.key == a.key) {
                return Err(format!(
                    "{} is a plain array, and also the key of the encoded tensor {} builds",
                    a.key, e.convention
                ));
            }
            items.push(Item::Plain(i));
        }
    }
    Ok(items)
}

/// How the module at `module` (its arrays `module + suffix`) is encoded, if it is.
fn module_encoding(
    cx: &Context<'_>,
    module: &str,
    anchor_suffix: &str,
    arrays: &[SourceTensor],
    read: &ReadArray<'_>,
    known: &Declarations<'_>,
) -> Result<Option<EncodedModel>, String> {
    let table = table();
    let (by_name, declared) = (&known.by_name, &known.declared);
    let module_doc = known.module_docs.get(module);
    let (config_doc, converter) = (known.config_doc.as_ref(), known.converter);
    let present = |c: &Convention, i: usize| {
        by_name
            .get(format!("{module}{}", c.parts[i].suffix).as_str())
            .copied()
    };
    // Whether the anchor is stored as this convention stores it, and whether companions exist.
    let anchored = |c: &Convention| {
        present(c, 0).is_some_and(|i| c.anchor_dtypes.iter().any(|d| d == arrays[i].dtype.name()))
    };
    let companions = |c: &Convention| (1..c.parts.len()).any(|p| present(c, p).is_some());
    let here = |c: &Convention| c.parts[0].suffix == anchor_suffix;

    // Declared for this module: its own marker first, then the component's declarations.
    let mut candidates: Vec<(&Convention, Option<&Json>, Option<&Json>)> = Vec::new();
    if let Some((conventions, doc, _)) = module_doc {
        for c in conventions {
            candidates.push((c, Some(doc), config_doc));
        }
    }
    if candidates.is_empty() {
        for (c, doc) in declared {
            candidates.push((c, None, doc.as_ref().or(config_doc)));
        }
    }
    let relevant: Vec<_> = candidates
        .iter()
        .filter(|(c, _, _)| here(c) && present(c, 0).is_some())
        .collect();
    if !relevant.is_empty() {
        let mut errors = Vec::new();
        for (c, marker, config) in &relevant {
            if !anchored(c) {
                if companions(c) {
                    let a = &arrays[present(c, 0).expect("relevant")];
                    errors.push(format!(
                        "{}: {} is {}, not {} as {} stores it",
                        c.name,
                        a.key,
                        a.dtype,
                        c.anchor_dtypes.join(" or "),
                        c.producer
                    ));
                }
                continue;
            }
            match build(cx, c, module, by_name, arrays, read, *marker, *config) {
                Ok(model) => return Ok(Some(model)),
                Err(why) => errors.push(format!("{}: {why}", c.name)),
            }
        }
        if errors.is_empty() {
            return Ok(None);
        }
        let declared_by = module_doc.map_or_else(
            || {
                converter.map_or_else(
                    || "the component's quantization declaration".to_owned(),
                    |c| format!("--converter {}", c.name),
                )
            },
            |(_, _, key)| key.clone(),
        );
        return Err(format!(
            "module {module} (declared by {declared_by}) cannot be read as declared: {}",
            errors.join("; ")
        ));
    }
    if module_doc.is_some() {
        // Judged once every module is seen (recognize): a declared module never falls back
        // to the undeclared rules.
        return Ok(None);
    }

    // Undeclared: only arrays that look like a convention's (anchor stored as it stores it,
    // and a companion beside it).
    let looks: Vec<&Convention> = table
        .conventions
        .iter()
        .filter(|c| here(c) && anchored(c) && companions(c))
        .collect();
    if looks.is_empty() {
        return Ok(None);
    }
    let mut built: Vec<(&Convention, EncodedModel)> = Vec::new();
    for c in &looks {
        if let Ok(model) = build(cx, c, module, by_name, arrays, read, None, config_doc) {
            built.push((c, model));
        }
    }
    let allowed = |c: &Convention| {
        c.declared_by
            .iter()
            .any(|d| matches!(d, Declaration::Undeclared { undeclared: true }))
    };
    let arrays_named: Vec<String> = looks
        .iter()
        .flat_map(|c| (0..c.parts.len()).filter_map(move |p| present(c, p)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|i| arrays[i].key.clone())
        .collect();
    let same = |a: &EncodedModel, b: &EncodedModel| {
        a.scheme == b.scheme && a.params == b.params && a.shape == b.shape && a.dtype == b.dtype
    };
    if let Some((_, first)) = built.iter().find(|(c, _)| allowed(c)) {
        if built.iter().all(|(_, m)| same(m, first)) {
            return Ok(Some(first.clone()));
        }
    }
    let names: Vec<String> = looks
        .iter()
        .map(|c| format!("{} ({})", c.name, c.producer))
        .collect();
    let what = if built.is_empty() {
        "incomplete or malformed"
    } else {
        "ambiguous"
    };
    if let Some(c) = converter {
        return Err(format!(
            "{} in component {:?} look like quantized arrays of {}, and --converter {} does not \
             read them",
            arrays_named.join(", "),
            cx.component,
            names.join(" or "),
            c.name
        ));
    }
    Err(format!(
        "{} in component {:?} look like quantized arrays of {}, but nothing declares the \
         convention (a config quantization_config, hf_quant_config.json, .comfy_quant or \
         scaled_fp8 marker), and the arrays alone are {what}; pass --converter NAME to declare it",
        arrays_named.join(", "),
        cx.component,
        names.join(" or ")
    ))
}

/// Builds `module`'s encoded tensor under `c`, checked by the decoder.
#[allow(clippy::too_many_arguments)]
fn build(
    cx: &Context<'_>,
    c: &Convention,
    module: &str,
    by_name: &HashMap<&str, usize>,
    arrays: &[SourceTensor],
    read: &ReadArray<'_>,
    marker: Option<&Json>,
    config: Option<&Json>,
) -> Result<EncodedModel, String> {
    let table = table();
    if let Some(doc) = marker {
        check_marker_keys(c, doc, &table.ignored_marker_keys)?;
    }
    // Parts present, in the table's order.
    let mut parts: Vec<(&PartRule, usize)> = Vec::new();
    for rule in &c.parts {
        if let Some(&i) = by_name.get(format!("{module}{}", rule.suffix).as_str()) {
            parts.push((rule, i));
        }
    }
    let anchor = &arrays[parts[0].1];
    let key = format!("{module}{}", c.key);
    let roles: BTreeSet<&str> = parts.iter().map(|(r, _)| r.role.as_str()).collect();
    let lookup = Lookup {
        marker,
        config,
        roles: &roles,
        columns: None,
    };

    let shape = logical_shape(c, module, &parts, arrays, read, marker)?;
    // The shape an F4 weight part has: the logical one, or the stored view when transposed.
    let mut f4_shape = shape.clone();
    if let Some(ShapeRule::TransposedBlocks { .. }) = &c.shape {
        f4_shape = stored_view(anchor)?;
    }
    let lookup = Lookup {
        columns: shape.last().copied(),
        ..lookup
    };

    // The logical dtype: the convention's rule, else the config's, else the component's floats.
    let dtype = match &c.dtype {
        Some(expr) => {
            let v = lookup.eval(expr)?;
            match &v {
                Json::Text(t) => {
                    torch_dtype(t).ok_or(format!("dtype {t:?} is not F32, BF16 or F16"))?
                }
                other => return Err(format!("dtype {} is not a name", JsonShow(other))),
            }
        }
        None => logical_dtype(cx, arrays),
    };

    let rules = candidate_encodings(c, &lookup)?;

    // Parts with their header dtypes and shapes; constants from the documents.
    let mut models = part_models(&parts, arrays, &f4_shape)?;
    models.extend(constants(c, &roles, &lookup)?);

    // The first candidate encoding the decoder accepts.
    let mut refusals = Vec::new();
    for rule in rules {
        let (scheme, params) = match encoding(rule, &lookup) {
            Ok(e) => e,
            Err(why) => {
                refusals.push(why);
                continue;
            }
        };
        match check(&scheme, &params, &dtype, &shape, &models, arrays, read) {
            Ok(()) => {
                return Ok(EncodedModel {
                    key,
                    dtype,
                    shape,
                    scheme,
                    params,
                    parts: models,
                    convention: c.name.clone(),
                })
            }
            Err(why) => refusals.push(why),
        }
    }
    // Name the arrays a missing part would have been.
    let missing: Vec<String> = c
        .parts
        .iter()
        .filter(|r| {
            refusals
                .iter()
                .any(|w| w.contains(&format!("part {:?} is missing", r.role)))
        })
        .map(|r| format!("{module}{}", r.suffix))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} is missing ({})",
            missing.join(", "),
            refusals.join("; ")
        ));
    }
    Err(refusals.join("; "))
}

/// The logical shape of `module`'s tensor by the convention's shape rule (`parts`: the rules
/// of the parts present, with their arrays; the anchor first): the anchor's (F4 packs two
/// values a byte), its row bytes in codes, the extents of parts, a part's values, the
/// transposed blocks' view, or the marker's list.
///
/// # Errors
/// The arrays or documents the rule reads are missing or do not make a shape.
fn logical_shape(
    c: &Convention,
    module: &str,
    parts: &[(&PartRule, usize)],
    arrays: &[SourceTensor],
    read: &ReadArray<'_>,
    marker: Option<&Json>,
) -> Result<Vec<u64>, String> {
    let anchor = &arrays[parts[0].1];
    Ok(match &c.shape {
        None => {
            let mut s = anchor.shape.clone();
            if parts[0].0.as_dtype.as_deref() == Some("F4") {
                let last = s.last_mut().ok_or("the weight is a scalar")?;
                *last = last.checked_mul(2).ok_or("shape overflows")?;
            }
            s
        }
        Some(ShapeRule::AnchorBits { anchor_bits }) => {
            let mut s = anchor.shape.clone();
            let last = s.last_mut().ok_or("the weight is a scalar")?;
            let bits = last.checked_mul(8).ok_or("shape overflows")?;
            if *anchor_bits == 0 || bits % anchor_bits != 0 {
                return Err(format!(
                    "{} holds {} bytes per row, not whole {anchor_bits}-bit codes",
                    anchor.key, *last
                ));
            }
            *last = bits / anchor_bits;
            s
        }
        Some(ShapeRule::Extents { rows, cols }) => {
            let extent = |(role, axis): &(String, usize)| -> Result<u64, String> {
                let (_, i) = parts
                    .iter()
                    .find(|(r, _)| r.role == *role)
                    .ok_or_else(|| format!("{module}: part {role} is missing"))?;
                arrays[*i].shape.get(*axis).copied().ok_or_else(|| {
                    format!(
                        "{} has rank {}, no axis {axis}",
                        arrays[*i].key,
                        arrays[*i].shape.len()
                    )
                })
            };
            vec![extent(rows)?, extent(cols)?]
        }
        Some(ShapeRule::Values { values }) => {
            let (_, i) = parts
                .iter()
                .find(|(r, _)| r.role == *values)
                .ok_or_else(|| format!("{module}: part {values} is missing"))?;
            integers(&arrays[*i], &read(*i)?)?
        }
        Some(ShapeRule::TransposedBlocks { transposed_blocks }) => {
            if !transposed_blocks {
                return Err("the table's transposed_blocks is false, which no layout means".into());
            }
            let mut s = stored_view(anchor)?;
            let n = s.len();
            s.swap(n - 2, n - 1);
            s
        }
        Some(ShapeRule::Marker { marker: k }) => {
            let doc = marker.ok_or("no marker document states the shape")?;
            match doc.get(k) {
                Some(Json::Array(items)) => items
                    .iter()
                    .map(|v| match v {
                        Json::Uint(n) => Ok(*n),
                        other => Err(format!("marker {k}: {} is not an extent", JsonShow(other))),
                    })
                    .collect::<Result<_, _>>()?,
                _ => return Err(format!("marker has no {k} list")),
            }
        }
    })
}

/// The convention's encodings that apply: the first whose `when` holds; where that one has no
/// `when`, every one without (tried in order, the first the decoder accepts taken).
///
/// # Errors
/// A value `when` reads cannot be looked up, or no encoding applies.
fn candidate_encodings<'c>(
    c: &'c Convention,
    lookup: &Lookup<'_>,
) -> Result<Vec<&'c EncodingRule>, String> {
    let mut chosen = None;
    for rule in &c.encodings {
        let applies = rule.when.iter().try_fold(true, |ok, (path, values)| {
            Ok::<bool, String>(
                ok && {
                    let v = lookup.config_value(path)?;
                    values.iter().any(|w| json_eq(&v, w))
                },
            )
        })?;
        if applies {
            chosen = Some(rule);
            break;
        }
    }
    match chosen {
        Some(r) if r.when.is_empty() => {
            Ok(c.encodings.iter().filter(|e| e.when.is_empty()).collect())
        }
        Some(r) => Ok(vec![r]),
        None => Err("no encoding of the convention matches the config".into()),
    }
}

/// The parts of `parts` with the dtype and shape their headers give them: the array's own,
/// or the rule's `as_dtype` (an F4 part takes `f4_shape`, and must hold exactly its bytes).
///
/// # Errors
/// An array's bytes or bits cannot hold the dtype the rule gives it.
fn part_models(
    parts: &[(&PartRule, usize)],
    arrays: &[SourceTensor],
    f4_shape: &[u64],
) -> Result<Vec<PartModel>, String> {
    let mut models: Vec<PartModel> = Vec::new();
    for (rule, i) in parts {
        let a = &arrays[*i];
        let (dtype, shape) = match rule.as_dtype.as_deref() {
            None => (a.dtype.clone(), a.shape.clone()),
            Some(name) => {
                let d = Dtype::parse(name).map_err(|e| e.to_string())?;
                if d == Dtype::F4 {
                    let shape = f4_shape;
                    let want = d.byte_len(shape).ok().flatten();
                    if want != Some(a.length) {
                        return Err(format!(
                            "{} holds {} bytes, not the {} of F4 {:?}",
                            a.key,
                            a.length,
                            want.map_or("?".into(), |n| n.to_string()),
                            shape
                        ));
                    }
                    (d, shape.to_vec())
                } else {
                    if a.dtype.bits() != d.bits() {
                        return Err(format!("{} is {}, which cannot hold {d}", a.key, a.dtype));
                    }
                    (d, a.shape.clone())
                }
            }
        };
        models.push(PartModel {
            role: rule.role.clone(),
            dtype,
            shape,
            source: PartSource::Array(*i),
        });
    }
    Ok(models)
}

/// The convention's constant parts (each an F32 scalar from the documents), less those whose
/// `if_part` role is not among `roles`.
///
/// # Errors
/// A value cannot be looked up, or is no number of the constant's dtype.
fn constants(
    c: &Convention,
    roles: &BTreeSet<&str>,
    lookup: &Lookup<'_>,
) -> Result<Vec<PartModel>, String> {
    let mut models = Vec::new();
    for k in &c.constants {
        if k.if_part
            .as_ref()
            .is_some_and(|r| !roles.contains(r.as_str()))
        {
            continue;
        }
        let v = lookup.eval(&k.value)?;
        let dtype = Dtype::parse(&k.dtype).map_err(|e| e.to_string())?;
        let bytes = match (&dtype, &v) {
            (Dtype::F32, Json::Float(f)) => (*f as f32).to_le_bytes().to_vec(),
            (Dtype::F32, Json::Uint(n)) => (*n as f32).to_le_bytes().to_vec(),
            (Dtype::F32, Json::Int(n)) => (*n as f32).to_le_bytes().to_vec(),
            _ => {
                return Err(format!(
                    "{}: {} is not a {dtype} number",
                    k.role,
                    JsonShow(&v)
                ))
            }
        };
        models.push(PartModel {
            role: k.role.clone(),
            dtype,
            shape: Vec::new(),
            source: PartSource::Bytes(bytes),
        });
    }

    Ok(models)
}

/// The stored view `[lead…, N, K]` of blocks `[lead…, N, K/B, B/2]` of F4 pairs.
fn stored_view(anchor: &SourceTensor) -> Result<Vec<u64>, String> {
    let s = &anchor.shape;
    if s.len() < 3 {
        return Err(format!(
            "{} has rank {}, not [.., N, blocks, bytes]",
            anchor.key,
            s.len()
        ));
    }
    let (lead, tail) = s.split_at(s.len() - 2);
    let k = tail[0]
        .checked_mul(tail[1])
        .and_then(|b| b.checked_mul(2))
        .ok_or("shape overflows")?;
    let mut view = lead.to_vec();
    view.push(k);
    Ok(view)
}

/// Scheme and params of `rule`.
fn encoding(rule: &EncodingRule, lookup: &Lookup<'_>) -> Result<(String, Config), String> {
    let mut scheme = rule.scheme.clone();
    for (name, expr) in &rule.vars {
        let v = lookup.eval(expr)?;
        let text = match &v {
            Json::Text(t) => t.clone(),
            Json::Uint(n) => n.to_string(),
            other => return Err(format!("{name}: {} is not a name", JsonShow(other))),
        };
        scheme = scheme.replace(&format!("{{{name}}}"), &text);
    }
    let mut params = Config::new();
    for (name, expr) in &rule.params {
        let v = lookup.eval(expr)?;
        params.insert(name.clone(), param_value(name, &v)?);
    }
    Ok((scheme, params))
}

/// A document value as a param (spec §4: no floats, no null).
fn param_value(name: &str, v: &Json) -> Result<Value, String> {
    match v {
        Json::Null | Json::Float(_) => Err(format!(
            "param {name}: {} is not a param value",
            JsonShow(v)
        )),
        Json::Array(items) => Ok(Value::Array(
            items
                .iter()
                .map(|i| param_value(name, i))
                .collect::<Result<_, _>>()?,
        )),
        other => Ok(json::to_value(other)),
    }
}

/// Runs the decoder's checks on the tensor as it would be stored.
fn check(
    scheme: &str,
    params: &Config,
    dtype: &Dtype,
    shape: &[u64],
    parts: &[PartModel],
    arrays: &[SourceTensor],
    read: &ReadArray<'_>,
) -> Result<(), String> {
    let mut held: Vec<memmap2::MmapMut> = Vec::new();
    let mut owned: Vec<Vec<u8>> = Vec::new();
    enum At {
        Owned(usize),
        Held(usize),
    }
    let mut at = Vec::new();
    for p in parts {
        match &p.source {
            PartSource::Bytes(b) => {
                owned.push(b.clone());
                at.push(At::Owned(owned.len() - 1));
            }
            PartSource::Array(i) if arrays[*i].length <= CHECKED_PART_BYTES => {
                owned.push(read(*i)?);
                at.push(At::Owned(owned.len() - 1));
            }
            PartSource::Array(i) => {
                // Untouched anonymous memory of the right length: never faulted in unless
                // the decoder reads it.
                let map = memmap2::MmapMut::map_anon(arrays[*i].length as usize)
                    .map_err(|e| format!("cannot map {} bytes: {e}", arrays[*i].length))?;
                held.push(map);
                at.push(At::Held(held.len() - 1));
            }
        }
    }
    let decode_parts = parts
        .iter()
        .zip(&at)
        .map(|(p, a)| decode::Part {
            role: &p.role,
            dtype: &p.dtype,
            shape: &p.shape,
            bytes: match a {
                At::Owned(k) => &owned[*k],
                At::Held(k) => &held[*k],
            },
        })
        .collect();
    let tensor = decode::Encoded {
        scheme,
        params,
        dtype,
        shape,
        parts: decode_parts,
    };
    decode::prepare(&tensor)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
/// A torch dtype name (`float16`, `torch.bfloat16`) as a logical dtype.
fn torch_dtype(name: &str) -> Option<Dtype> {
    match name.strip_prefix("torch.").unwrap_or(name) {
        "float32" | "float" => Some(Dtype::F32),
        "bfloat16" => Some(Dtype::BF16),
        "float16" | "half" => Some(Dtype::F16),
        _ => None,
    }
}

/// The dtype quantized weights stand for: the config's `torch_dtype` (or `dtype`), else the
/// dtype most of the component's float arrays other than companions have. Where neither tells
/// (no config dtype, and no float arrays or as many of one dtype as of another), F32: every
/// decoder computes in F32 and rounds once to the logical dtype (`decode`), so F32 holds each
/// decoded value exactly, where BF16 or F16 would be a guess that may round. A quantized
/// checkpoint saved alone (fp8 weights with F32 scales, nothing else) is therefore legal.
fn logical_dtype(cx: &Context<'_>, arrays: &[SourceTensor]) -> Dtype {
    for key in ["torch_dtype", "dtype"] {
        if let Some(Value::Text(t)) = cx.config.get(key) {
            if let Some(d) = torch_dtype(t) {
                return d;
            }
        }
    }
    // Companion arrays (scales are often F32 in a BF16 model) do not count.
    let companions: BTreeSet<&str> = table()
        .conventions
        .iter()
        .flat_map(|c| c.parts.iter().skip(1).map(|p| p.suffix.as_str()))
        .collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for a in arrays {
        let companion = companions.iter().any(|s| a.key.ends_with(s));
        if !companion && matches!(a.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            *counts.entry(a.dtype.name()).or_default() += 1;
        }
    }
    let mut ranked: Vec<(usize, &str)> = counts.into_iter().map(|(d, n)| (n, d)).collect();
    ranked.sort_by(|a, b| b.cmp(a));
    match ranked.as_slice() {
        [(_, d)] => Dtype::parse(d).expect("a known name"),
        [(a, d), (b, _), ..] if a > b => Dtype::parse(d).expect("a known name"),
        _ => Dtype::F32,
    }
}

/// A marker array's JSON document (U8 or I8 bytes of UTF-8 JSON).
fn marker_doc(a: &SourceTensor, i: usize, read: &ReadArray<'_>) -> Result<Json, String> {
    if a.length > 1 << 20 {
        return Err(format!(
            "{}: a {} byte marker is too large",
            a.key, a.length
        ));
    }
    let bytes = read(i)?;
    // Some producers pad with NULs.
    let end = bytes.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1);
    json::parse_config(&bytes[..end]).map_err(|e| format!("{}: not a JSON document: {e}", a.key))
}

/// The little-endian integer values of an I32, I64, U8 … array.
fn integers(a: &SourceTensor, bytes: &[u8]) -> Result<Vec<u64>, String> {
    let size = match a.dtype {
        Dtype::I32 | Dtype::U32 => 4,
        Dtype::I64 | Dtype::U64 => 8,
        _ => return Err(format!("{} is {}, not I32 or I64", a.key, a.dtype)),
    };
    bytes
        .chunks_exact(size)
        .map(|c| {
            let v = if size == 4 {
                i64::from(i32::from_le_bytes(c.try_into().expect("4 bytes")))
            } else {
                i64::from_le_bytes(c.try_into().expect("8 bytes"))
            };
            u64::try_from(v).map_err(|_| format!("{} holds {v}, not an extent", a.key))
        })
        .collect()
}

mod lookup;
mod table;

pub(crate) use lookup::from_serde;
use lookup::{check_marker_keys, json_eq, matches_all, JsonShow, Lookup};
pub(crate) use table::{declaration_files, names};
use table::{table, Convention, Declaration, EncodingRule, PartRule, ShapeRule};

#[cfg(test)]
mod tests;
