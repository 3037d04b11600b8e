//! Single-file checkpoints imported as the Diffusers components they hold: the converter
//! `layout::convert` recognises a file by, the components' configs derived from the weights
//! (`configs`), and the lane model that stores them, with the recipe that re-creates the file.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

pub(crate) use crate::layout::convert::named;
use crate::layout::convert::{recognise, table, Conversion, Converted, Outcome, SourceKey};

pub(crate) mod configs;

#[cfg(test)]
mod tests;

/// The `__metadata__` key in which producers say what a model predicts (ModelSpec).
const PREDICTION_METADATA: &str = "modelspec.prediction_type";

/// From how many bytes the arrays a conversion leaves in the file alone are noted.
const KEPT_NOTED_BYTES: u64 = 1 << 20;

/// The values to declare with `--prediction-type` (Diffusers' scheduler `prediction_type`).
pub const PREDICTION_TYPES: [&str; 2] = ["epsilon", "v_prediction"];

/// Converts a lane holding one safetensors file (`model`'s only component) into the
/// Diffusers components the table recognises it as, in place: each converted component's
/// tensors as Diffusers writes them (dtype descending, then name, the order a Diffusers
/// folder's import stores, so both share chunks), its config derived from the weights, the
/// pipeline's tokenizer and scheduler from the family, `model_index.json`; the file's own
/// component keeps the arrays Diffusers does not load, and the recipe re-creates the file
/// from all of them. A file no converter takes (or a quantized one, not converted yet) is
/// left as it is; one that the converters taking it cannot convert is too, with a warning.
/// `config.prediction_type` (`--prediction-type`) is what the model predicts, over the file's
/// markers; `config.converter` names the converter; `config.pipeline` is a pipeline the
/// components of a model alone, or of a whole checkpoint that cannot stand alone, join
/// ([`compose`]).
///
/// # Errors
/// Two converters convert the file and `--converter` names none; the named one cannot convert
/// the file; the family's files do not say what they predict and `prediction` is `None`;
/// `prediction` is given for a file that is not converted, or that makes a model alone whose
/// config does not depend on it; `pipeline` is given for a file that is not converted, or
/// that the pipeline cannot take.
pub(crate) fn apply(
    model: &mut super::lane::LaneModel,
    config: &super::ImportConfig,
) -> Result<(), super::ImportError> {
    use super::convention::Item;
    use super::ImportError;

    let prediction = config.prediction_type.as_deref();
    let named = config.converter.as_deref().and_then(named);
    let [c] = model.components.as_slice() else {
        return Ok(());
    };
    let (Some(path), [lane_path]) = (c.weights.first(), c.lane_paths.as_slice()) else {
        return Ok(());
    };
    let (path, lane_path) = (path.clone(), lane_path.clone());
    let fail = |why: String| ImportError::source(&path, why);
    if let Some(base) = config
        .pipeline
        .as_ref()
        .filter(|b| b.commit.header.pipeline.is_none())
    {
        return Err(fail(format!(
            "--pipeline {}: it is no pipeline (its lane has no model_index.json)",
            base.name
        )));
    }
    // A file that stays as it is: a warning, unless the user asked for a conversion
    // (`--converter`) or declared what only a converted file has (`--prediction-type`).
    let unconverted = |model: &mut super::lane::LaneModel, why: String| {
        if let Some(n) = named {
            return Err(fail(format!("--converter {}: {why}", n.name)));
        }
        if let Some(p) = prediction {
            return Err(fail(format!(
                "--prediction-type {p}: the file is not converted to Diffusers components \
                 ({why})"
            )));
        }
        if let Some(base) = &config.pipeline {
            return Err(fail(format!(
                "--pipeline {}: the file is not converted to Diffusers components ({why})",
                base.name
            )));
        }
        let warning = format!("{lane_path}: not converted to Diffusers components: {why}");
        model.warnings.push(warning);
        Ok(())
    };
    if !c.items.iter().all(|i| matches!(i, Item::Plain(_))) {
        let why = "a quantized single file is not converted".to_owned();
        if named.is_none() && prediction.is_none() && config.pipeline.is_none() {
            return Ok(());
        }
        return unconverted(model, why);
    }
    let arrays: Vec<SourceKey<'_>> = c
        .tensors
        .iter()
        .map(|t| SourceKey {
            key: &t.key,
            shape: &t.shape,
        })
        .collect();
    let metadata = model
        .file_metadata
        .get(&c.name)
        .map_or(&[][..], Vec::as_slice);
    let keys: BTreeSet<&str> = c.tensors.iter().map(|t| t.key.as_str()).collect();
    let mut marked = table().marked(&keys, metadata);
    let joined = config.pipeline.as_ref().map(|p| &p.commit.header);
    let check =
        |conversion: &Conversion<'_>| configs(conversion, &c.tensors, &marked, joined).map(|_| ());
    let conversion = match recognise(table(), &arrays, named, &check).map_err(fail)? {
        Outcome::Unknown => {
            let why = "no converter of fs-layout/single_file.json takes it".to_owned();
            return match (prediction, &config.pipeline) {
                (None, None) => Ok(()),
                _ => unconverted(model, why),
            };
        }
        Outcome::Unconverted(why) | Outcome::Lacking(why) => return unconverted(model, why),
        Outcome::Converted(c) => c,
    };
    let converter = &conversion.converter.name;
    for why in &conversion.passed_over {
        model.warnings.push(format!("{lane_path}: {why}"));
    }
    let family = &table().families[&conversion.converter.family];
    prediction_flag(prediction, &conversion, family, config).map_err(fail)?;
    // A value of the file's own that no marker reads leaves the family's default in force.
    let unread = metadata
        .iter()
        .find(|(k, _)| k == PREDICTION_METADATA)
        .filter(|_| prediction.is_none() && marked_prediction(&marked).is_none())
        .map(|(_, v)| v.clone());
    // The file must convert before what it predicts matters.
    let decided = decide(family, &mut marked, prediction, metadata);
    let mut built = match build(&conversion, c, &path, &marked, joined) {
        Ok(built) => built,
        Err(why) => return unconverted(model, format!("{converter}: {why}")),
    };
    decided.map_err(|why| fail(format!("{converter}: {why}")))?;
    if let Some(v) = unread {
        // A family that must know asked for the flag above; the others' schedulers decide.
        let used = match conversion.converter.pipeline {
            None => "a model alone has no scheduler it would set",
            Some(_) => "its scheduler's own default is used",
        };
        model.warnings.push(format!(
            "{lane_path}: its {PREDICTION_METADATA} {v:?} is none the table knows; {used}"
        ));
    }
    if let Some(base) = &config.pipeline {
        compose(&mut built, base)
            .map_err(|why| fail(format!("--pipeline {}: {why}", base.name)))?;
    }
    let prediction_type = marked_prediction(&marked).map(str::to_owned);
    install(model, &conversion, built, lane_path, prediction_type);
    Ok(())
}

/// That `--prediction-type` (`prediction`) fits the conversion: not for a model alone whose
/// family's configs do not depend on it, nor for a whole checkpoint joining a pipeline (whose
/// scheduler says), nor for a flow-matching family (`prediction_fixed`).
///
/// # Errors
/// The flag is given where it does not fit, saying why.
fn prediction_flag(
    prediction: Option<&str>,
    conversion: &Conversion<'_>,
    family: &serde_json::Value,
    config: &super::ImportConfig,
) -> Result<(), String> {
    let converter = &conversion.converter.name;
    // A model alone has no scheduler; only a family whose configs depend on what the model
    // predicts (an SD 2.x UNet's sample size and attention upcast) takes the flag for one.
    if let (Some(p), None, None) = (
        prediction,
        &conversion.converter.pipeline,
        family.get("prediction_types"),
    ) {
        return Err(format!(
            "--prediction-type {p}: {converter} makes a model alone, with no scheduler, whose \
             config does not depend on it"
        ));
    }
    // A whole checkpoint that joins a pipeline takes its scheduler, which says what it predicts.
    if let (Some(p), Some(_), Some(base), None) = (
        prediction,
        &conversion.converter.pipeline,
        &config.pipeline,
        family.get("prediction_types"),
    ) {
        return Err(format!(
            "--prediction-type {p}: joining {}, {converter} takes its scheduler, which says what \
             the model predicts",
            base.name
        ));
    }
    // A flow-matching family's scheduler has no prediction type to set.
    if let (Some(p), Some(why)) = (
        prediction,
        family
            .get("prediction_fixed")
            .and_then(serde_json::Value::as_str),
    ) {
        return Err(format!("--prediction-type {p}: {converter}: {why}"));
    }
    Ok(())
}

/// Puts `built` in `model` in place of its one component: the converted components, then the
/// file's own, which keeps what no Diffusers component takes (in data order, under a name no
/// converted component has: a VAE downloaded as `vae.safetensors`); the recipe's file at
/// `lane_path` made from them all; the pipeline; what the lane's single file is.
fn install(
    model: &mut super::lane::LaneModel,
    conversion: &Conversion<'_>,
    built: Built,
    lane_path: String,
    prediction_type: Option<String>,
) {
    use super::convention::Item;
    use crate::layout::recipe::SourceFile;

    let mut own = model.components.pop().expect("one component");
    let kept: Vec<super::scan::SourceTensor> = conversion
        .kept
        .iter()
        .map(|&i| own.tensors[i].clone())
        .collect();
    if let Some(note) = kept_note(&kept) {
        model.warnings.push(format!("{lane_path}: {note}"));
    }
    own.items = (0..kept.len()).map(Item::Plain).collect();
    own.tensors = kept;
    let taken = |name: &str| built.components.iter().any(|m| m.name == name);
    let mut name = own.name.clone();
    for n in 1.. {
        if !taken(&name) {
            break;
        }
        name = match n {
            1 => format!("{}_file", own.name),
            n => format!("{}_file{n}", own.name),
        };
    }
    if let Some(meta) = model.file_metadata.remove(&own.name) {
        model.file_metadata.insert(name.clone(), meta);
    }
    own.name = name;
    if let Some(SourceFile::Safetensors {
        component, arrays, ..
    }) = model.recipe.0.get_mut(&lane_path)
    {
        *component = own.name.clone();
        *arrays = built.arrays;
    }
    model.pipeline = built.pipeline;
    model.single_file = Some(super::lane::SingleFile {
        converter: conversion.converter.name.clone(),
        file: lane_path,
        component: own.name.clone(),
        prediction_type,
    });
    model.components = built.components;
    model.components.push(own);
}

/// A note on the arrays a conversion leaves in the file alone (`kept`), when they add up to
/// [`KEPT_NOTED_BYTES`] or more: buffers and position ids are small, but megabytes the face
/// leaves out (EMA weights, another checkpoint's text encoder) are worth a word. It names the
/// largest groups by the first segment of their keys (`model_ema`), each of at least a tenth
/// of the bytes, three at the most.
fn kept_note(kept: &[super::scan::SourceTensor]) -> Option<String> {
    let left: u64 = kept.iter().map(|t| t.length).sum();
    if left < KEPT_NOTED_BYTES {
        return None;
    }
    let mut groups: BTreeMap<&str, u64> = BTreeMap::new();
    for t in kept {
        *groups
            .entry(t.key.split('.').next().unwrap_or(&t.key))
            .or_default() += t.length;
    }
    let mut groups: Vec<(&str, u64)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20));
    let under: Vec<String> = groups
        .iter()
        .take(3)
        .filter(|(_, bytes)| *bytes >= left / 10)
        .map(|(group, bytes)| format!("{group}.* {}", mib(*bytes)))
        .collect();
    let arrays = match kept.len() {
        1 => "1 array".to_owned(),
        n => format!("{n} arrays"),
    };
    Some(format!(
        "{arrays} ({}; the most under {}) that no Diffusers component takes stay in the file \
         only; the @diffusers face leaves them out",
        mib(left),
        under.join(", ")
    ))
}

/// What a conversion makes of a file: the Diffusers components (converted, and the
/// pipeline's tokenizers and scheduler), by name; what each array of the file is; the
/// pipeline.
struct Built {
    components: Vec<super::lane::ComponentModel>,
    arrays: BTreeMap<String, crate::layout::recipe::ArraySource>,
    pipeline: Option<crate::format::Pipeline>,
}

/// Makes `built`, the components of a model alone (or of a whole checkpoint whose family
/// has no offline source for some of its pipeline's, `needs_pipeline`), part of `base`'s
/// pipeline: the pipeline is `base`'s, the components `base`'s in its order (less a
/// single-file lane's own), each the file's where the file holds one of that name, else
/// `base`'s (tokenizers and scheduler among them) or the `--component` standing in for it,
/// borrowed as its commit stores it. Whether the converter may join `base` at all was asked
/// when its configs were derived ([`joinable`]).
///
/// # Errors
/// `base` has no pipeline; the pipeline has no component of a converted one's name, or one of
/// another class; a `--component` is given twice, names no component of the pipeline or one
/// the file holds, or does not stand in ([`stand_in`]).
fn compose(built: &mut Built, base: &super::PipelineBase) -> Result<(), String> {
    let header = &base.commit.header;
    let Some(pipeline) = &header.pipeline else {
        return Err("it is no pipeline".into());
    };
    for ours in &built.components {
        match header.component(&ours.name) {
            None => {
                return Err(format!(
                    "its {} has no component {}",
                    pipeline.class.name, ours.name
                ))
            }
            Some(theirs) if theirs.class.name != ours.class.name => {
                return Err(format!(
                    "its {} is of class {}, the file's of {}",
                    ours.name, theirs.class.name, ours.class.name
                ))
            }
            Some(_) => {}
        }
    }
    let mut ours = std::mem::take(&mut built.components);
    // A single-file lane's own component (what Diffusers does not load) is no pipeline's.
    let own = crate::layout::LaneView::single_file_component(header);
    let mut named = BTreeSet::new();
    for lent in &base.components {
        if !named.insert(lent.name.as_str()) {
            return Err(format!("--component {} is given more than once", lent.name));
        }
        if header.component(&lent.name).is_none() || Some(lent.name.as_str()) == own {
            return Err(format!(
                "its {} has no component {} for --component {}={}",
                pipeline.class.name, lent.name, lent.name, lent.from
            ));
        }
        if ours.iter().any(|c| c.name == lent.name) {
            return Err(format!(
                "the file holds its own {}, which --component {}={} cannot stand in for",
                lent.name, lent.name, lent.from
            ));
        }
    }
    for theirs in header
        .components
        .iter()
        .filter(|c| Some(c.name.as_str()) != own)
    {
        let component = match (
            ours.iter().position(|c| c.name == theirs.name),
            base.components.iter().find(|l| l.name == theirs.name),
        ) {
            (Some(i), _) => ours.remove(i),
            (None, Some(lent)) => borrowed(theirs, stand_in(lent, theirs)?, &lent.commit.header),
            (None, None) => borrowed(theirs, theirs, header),
        };
        built.components.push(component);
    }
    built.pipeline = Some(pipeline.clone());
    Ok(())
}

/// The pipeline's component `theirs` as `component` of the commit `from` has it, borrowed:
/// its entry taken as it is (renamed `theirs`' name), its tensors in `from`'s chunks.
fn borrowed(
    theirs: &crate::format::Component,
    component: &crate::format::Component,
    from: &crate::format::Header,
) -> super::lane::ComponentModel {
    use super::lane::{Borrowed, ComponentModel};

    let mut component = component.clone();
    component.name.clone_from(&theirs.name);
    ComponentModel {
        config: component.config.clone(),
        config_file: component.config_file.clone(),
        borrowed: Some(Borrowed {
            component,
            chunks: from.chunks.clone().into(),
            encodings: from.encodings.clone().into(),
        }),
        ..ComponentModel::empty(&theirs.name, theirs.class.clone())
    }
}

/// The component of `lent`'s commit that stands in for the pipeline's component `theirs`:
/// its component of that name, else (a model folder, or a file of a model alone) its one
/// model; of `theirs`' class, with the values of the class's `interfaces` keys that `theirs`
/// has.
///
/// # Errors
/// The commit has no such component; it is of another class; an interface value differs.
fn stand_in<'h>(
    lent: &'h super::LentComponent,
    theirs: &crate::format::Component,
) -> Result<&'h crate::format::Component, String> {
    let header = &lent.commit.header;
    let flag = format!("--component {}={}", lent.name, lent.from);
    let own = crate::layout::LaneView::single_file_component(header);
    let models: Vec<&crate::format::Component> = header
        .components
        .iter()
        .filter(|c| !c.tensors.is_empty() && Some(c.name.as_str()) != own)
        .collect();
    let found = match (header.component(&lent.name), models.as_slice()) {
        (Some(c), _) => c,
        (None, [one]) if header.pipeline.is_none() => one,
        _ => {
            return Err(format!(
                "{flag}: {} has no component {}, nor is it one model alone",
                lent.from, lent.name
            ))
        }
    };
    if found.class.name != theirs.class.name {
        let class = |name: &str| match name {
            "" => "no class (it is a file, not a model TensorFS converted)".to_owned(),
            name => format!("class {name}"),
        };
        return Err(format!(
            "{flag}: its {} has {}, the pipeline's {} has {}",
            found.name,
            class(&found.class.name),
            theirs.name,
            class(&theirs.class.name)
        ));
    }
    for key in table()
        .interfaces
        .get(&theirs.class.name)
        .into_iter()
        .flatten()
    {
        let want = theirs.config.get(key).filter(|v| !v.to_serde().is_null());
        let (Some(want), got) = (want, found.config.get(key)) else {
            continue;
        };
        if got != Some(want) {
            return Err(format!(
                "{flag}: its {key} is {}, and the pipeline's {} has {}",
                got.map_or("missing".into(), |v| v.to_serde().to_string()),
                theirs.name,
                want.to_serde()
            ));
        }
    }
    Ok(found)
}

/// Whether a file `converter` converts may join the pipeline of `joined` (`import
/// --pipeline`), or convert without one (`None`): a model alone may join any; a whole
/// checkpoint only when its family lacks an offline source for some of its pipeline's
/// components (`needs_pipeline`), and then it must, a pipeline of its own class.
///
/// # Errors
/// Which of those rules the file breaks.
fn joinable(
    converter: &crate::layout::convert::Converter,
    joined: Option<&crate::format::Header>,
) -> Result<(), String> {
    let Some(ours) = &converter.pipeline else {
        return Ok(());
    };
    match (&converter.needs_pipeline, joined) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(format!(
            "{} makes a whole pipeline of its own; only a model alone, or a whole checkpoint \
             that needs a stored pipeline's other components, joins one",
            converter.name
        )),
        (Some(why), None) => Err(format!(
            "{why}: it converts joining a stored {ours} (import --pipeline NAME)"
        )),
        (Some(_), Some(header)) => match header.pipeline.as_ref().map(|p| &p.class.name) {
            None => Err("it is no pipeline".into()),
            Some(class) if !converter.pipelines().any(|p| p == class) => Err(format!(
                "it is a {class}, and {} makes a {ours}",
                converter.name
            )),
            Some(_) => converter.lends(header),
        },
    }
}

/// Config values by component, as markers and declarations set them.
type Marked = BTreeMap<String, serde_json::Map<String, serde_json::Value>>;

/// The scheduler's `prediction_type` that `marked` sets, if it sets one.
fn marked_prediction(marked: &Marked) -> Option<&str> {
    marked
        .get("scheduler")
        .and_then(|s| s.get("prediction_type"))
        .and_then(serde_json::Value::as_str)
}

/// Adds what the user declared to `marked` (the file's markers' values): `prediction` sets
/// the scheduler's `prediction_type`, over a marker's. A family whose files do not say what
/// they predict (SD 2.x: 512-base models predict noise, 768-v ones velocity) lists each
/// prediction type's values under `prediction_types` (sample sizes, …), which are added too;
/// when neither a marker nor `prediction` says which, the import asks for the flag.
///
/// # Errors
/// The family needs a prediction type and none is marked or declared, or the one given is
/// not among the family's.
fn decide(
    family: &serde_json::Value,
    marked: &mut Marked,
    prediction: Option<&str>,
    metadata: &[(String, String)],
) -> Result<(), String> {
    if let Some(p) = prediction {
        marked
            .entry("scheduler".into())
            .or_default()
            .insert("prediction_type".into(), p.into());
    }
    let Some(serde_json::Value::Object(choices)) = family.get("prediction_types") else {
        return Ok(());
    };
    let names: Vec<&str> = choices.keys().map(String::as_str).collect();
    let chosen = marked
        .get("scheduler")
        .and_then(|s| s.get("prediction_type"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    let Some(chosen) = chosen else {
        let why = family
            .get("prediction_unknown")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("its files do not say what the model predicts");
        // A value the markers do not know is worth naming: the file says something.
        let said = metadata
            .iter()
            .find(|(k, _)| k == PREDICTION_METADATA)
            .map(|(_, v)| format!(" (its {PREDICTION_METADATA} {v:?} is none the table knows)"))
            .unwrap_or_default();
        return Err(format!(
            "{why}{said}; declare it with --prediction-type {}",
            names.join("|")
        ));
    };
    let Some(serde_json::Value::Object(values)) = choices.get(&chosen) else {
        return Err(format!(
            "prediction type {chosen:?} is not one of this family's ({})",
            names.join(", ")
        ));
    };
    for (component, values) in values {
        if let serde_json::Value::Object(values) = values {
            let entry = marked.entry(component.clone()).or_default();
            for (k, v) in values {
                entry.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    Ok(())
}

/// Builds `conversion` of component `c` (the file at `path`), with the config values `marked`
/// sets (the file's markers, the user's declarations), for the pipeline of `joined` if the
/// components join one.
///
/// # Errors
/// A config cannot be derived, or a transposed array cannot be read.
fn build(
    conversion: &Conversion<'_>,
    c: &super::lane::ComponentModel,
    path: &std::path::Path,
    marked: &Marked,
    joined: Option<&crate::format::Header>,
) -> Result<Built, String> {
    use super::lane::{Asset, ComponentModel};
    use crate::format::Pipeline;

    let converter = conversion.converter;
    let family = &table().families[&converter.family];
    let no_values = serde_json::Map::new();
    let marked_for = |name: &str| marked.get(name).unwrap_or(&no_values);
    let derived = configs(conversion, &c.tensors, marked, joined)?;
    let mut components = Vec::new();
    let mut arrays = BTreeMap::new();
    let mut listed = Vec::new();
    for converted in &conversion.components {
        let rule = converted.rule;
        let config = derived[&rule.name].clone();
        let mut m = ComponentModel::empty(&rule.name, class_ref(&rule.class));
        (m.tensors, m.items) = tensors(converted, c, path)?;
        m.weights = c.weights.clone();
        m.stamps = c.stamps.clone();
        arrays.extend(array_sources(converted, c));
        m.config = to_config(config);
        listed.push((rule.name.clone(), rule.class.clone()));
        components.push(m);
    }
    // A file that joins a stored pipeline takes its tokenizers and scheduler ([`compose`]).
    let pipeline = match converter
        .pipeline_for(&derived)
        .filter(|_| joined.is_none())
    {
        None => None,
        Some(class) => {
            for mut extra in configs::extras(family)? {
                extra.config.extend(marked_for(&extra.name).clone());
                listed.push((extra.name.clone(), extra.class.clone()));
                let mut m = ComponentModel::empty(&extra.name, class_ref(&extra.class));
                m.config = to_config(extra.config);
                m.config_file = Some(extra.config_file);
                m.assets = extra
                    .assets
                    .into_iter()
                    .map(|(name, bytes)| (name, Asset::Bytes(bytes)))
                    .collect();
                components.push(m);
            }
            listed.sort();
            Some(Pipeline {
                class: class_ref(&("diffusers".to_owned(), class.to_owned())),
                config: to_config(configs::pipeline(class, family, &listed)),
            })
        }
    };
    components.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Built {
        components,
        arrays,
        pipeline,
    })
}

/// The config of each component of `conversion` (by name), derived from its tensors (its
/// `torch_dtype` the one holding most of its bytes among `arrays`, the file's) with the values
/// `marked` sets, and allowed by the converter's `accept`.
///
/// # Errors
/// A config cannot be derived, or a value is not one the converter accepts.
fn configs(
    conversion: &Conversion<'_>,
    arrays: &[super::scan::SourceTensor],
    marked: &Marked,
    joined: Option<&crate::format::Header>,
) -> Result<BTreeMap<String, serde_json::Map<String, serde_json::Value>>, String> {
    let converter = conversion.converter;
    joinable(converter, joined)?;
    let family = &table().families[&converter.family];
    let no_values = serde_json::Map::new();
    let mut derived = BTreeMap::new();
    for converted in &conversion.components {
        let rule = converted.rule;
        let tensors: Vec<_> = converted
            .tensors
            .iter()
            .chain(&converted.identities)
            .cloned()
            .collect();
        // Each model's own: a checkpoint's fp8 transformer beside its BF16 text encoders.
        let dtype = main_dtype(
            converted
                .tensors
                .iter()
                .filter_map(|r| arrays.get(r.source)),
        );
        let config = configs::config(
            &rule.class,
            family,
            marked.get(&rule.name).unwrap_or(&no_values),
            &rule.name,
            &tensors,
            &dtype,
        )
        .map_err(|why| {
            let why = in_file_terms(&why, converted, arrays);
            format!("{}'s config: {why}", rule.name)
        })?;
        derived.insert(rule.name.clone(), config);
    }
    converter.agrees(&derived)?;
    match joined {
        None => converter.accepts(&derived)?,
        Some(header) => fits_joined(converter, &derived, header)?,
    }
    Ok(derived)
}

/// `why`, a message naming `converted`'s tensors by their Diffusers keys, with each key
/// followed by the file's name for its array (`arrays`, the file's), or for a key the file
/// lacks the name its component's reverse keymap gives it: the user looks for those in the
/// file.
fn in_file_terms(
    why: &str,
    converted: &Converted<'_>,
    arrays: &[super::scan::SourceTensor],
) -> String {
    let keys: Vec<&str> = converted.tensors.iter().map(|r| r.key.as_str()).collect();
    let in_file = |key: &str| {
        match converted.tensors.iter().find(|r| r.key == key) {
            Some(r) => arrays.get(r.source).map(|a| a.key.clone()),
            None => table().file_key(converted.rule, &keys, key),
        }
        .filter(|file| file != key)
    };
    let words: Vec<String> = why
        .split(' ')
        .map(|word| {
            let key = word.trim_end_matches([',', ':', ';', ')']);
            match key.contains('.').then(|| in_file(key)).flatten() {
                Some(file) => format!("{key} (the file's {file}){}", &word[key.len()..]),
                None => word.to_owned(),
            }
        })
        .collect();
    words.join(" ")
}

/// That `derived`, the configs of a model alone joining the pipeline of `header`, fits it:
/// the values of the keys the converter's `accept` tells models apart by (a UNet's context
/// width and input channels) and of its `joins` (the widths by which a model meets the
/// pipeline's others) are those of the pipeline's component of its name, and `accept`'s are
/// among `accept`'s unless the converter's family makes that pipeline class (the pipeline, not
/// the table's list, then says what fits: a reduced SDXL's narrower context; an SDXL UNet
/// still joins no refiner).
///
/// # Errors
/// The first value that differs from the pipeline's; or one `accept` does not allow, for a
/// family that makes other pipelines.
fn fits_joined(
    converter: &crate::layout::convert::Converter,
    derived: &BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    header: &crate::format::Header,
) -> Result<(), String> {
    for (component, key) in converter.joined_keys() {
        // A value the pipeline leaves null (Diffusers' `out_channels`: the input's) is its
        // class's default, which it does not state.
        let theirs = header.component(component).and_then(|c| c.config.get(key));
        let Some(theirs) = theirs
            .map(crate::format::Value::to_serde)
            .filter(|v| !v.is_null())
        else {
            continue;
        };
        let ours = derived.get(component).and_then(|c| c.get(key));
        if ours != Some(&theirs) {
            return Err(format!(
                "{component}'s {key} is {}, and the pipeline's {component} has {theirs}",
                ours.map_or("missing".into(), ToString::to_string),
            ));
        }
    }
    let Err(why) = converter.accepts(derived) else {
        return Ok(());
    };
    let class = header
        .pipeline
        .as_ref()
        .map_or("", |p| p.class.name.as_str());
    let family_makes = table()
        .converters
        .iter()
        .filter(|c| c.family == converter.family)
        .any(|c| c.pipelines().any(|p| p == class));
    match family_makes {
        true => Ok(()),
        false => Err(why),
    }
}

/// A converted component's tensors, as the safetensors library writes a file (dtype
/// descending, then name), each a byte range of the file (the array, or a row part of a split
/// array) or bytes the import computes (a transpose, or rows in another order).
fn tensors(
    converted: &Converted<'_>,
    c: &super::lane::ComponentModel,
    path: &std::path::Path,
) -> Result<(Vec<super::scan::SourceTensor>, Vec<super::convention::Item>), String> {
    use super::convention::Item;
    let mut made: Vec<(super::scan::SourceTensor, Option<Arc<[u8]>>)> = Vec::new();
    for r in &converted.tensors {
        let from = &c.tensors[r.source];
        let row = from.length / from.shape.first().copied().unwrap_or(1).max(1);
        let ((offset, length), bytes) = match (r.rows.as_slice(), r.transposed) {
            (_, true) => (
                (from.offset, from.length),
                Some(transposed(path, from)?.into()),
            ),
            ([], false) => ((from.offset, from.length), None),
            ([(begin, end)], false) => ((from.offset + begin * row, (end - begin) * row), None),
            (ranges, false) => {
                let bytes = reordered(path, from, ranges)?;
                ((from.offset, bytes.len() as u64), Some(bytes.into()))
            }
        };
        let tensor = super::scan::SourceTensor {
            key: r.key.clone(),
            shape: r.shape.clone(),
            offset,
            length,
            ..from.clone()
        };
        made.push((tensor, bytes));
    }
    for r in &converted.identities {
        let from = &c.tensors[r.source];
        let bytes = identity(&from.dtype, r.shape[0]).map_err(|why| format!("{}: {why}", r.key))?;
        let tensor = super::scan::SourceTensor {
            key: r.key.clone(),
            shape: r.shape.clone(),
            length: bytes.len() as u64,
            ..from.clone()
        };
        made.push((tensor, Some(bytes.into())));
    }
    made.sort_by(|(a, _), (b, _)| {
        crate::format::safetensors::library_order((&a.dtype, &a.key), (&b.dtype, &b.key))
    });
    let items = made
        .iter()
        .enumerate()
        .map(|(i, (_, bytes))| match bytes {
            Some(b) => Item::Computed(i, b.clone()),
            None => Item::Plain(i),
        })
        .collect();
    Ok((made.into_iter().map(|(t, _)| t).collect(), items))
}

/// What each array of the file that `converted` takes is: one of its tensors (perhaps
/// transposed), or rows of its tensors one after another.
fn array_sources(
    converted: &Converted<'_>,
    c: &super::lane::ComponentModel,
) -> BTreeMap<String, crate::layout::recipe::ArraySource> {
    use crate::layout::recipe::{ArraySource, TensorRows};
    let component = &converted.rule.name;
    let mut out = BTreeMap::new();
    // Per array: (its rows [begin, end), the tensor, the tensor's rows there).
    let mut spans: BTreeMap<usize, Vec<(u64, u64, &str, u64)>> = BTreeMap::new();
    for r in &converted.tensors {
        if r.rows.is_empty() {
            let source = ArraySource::Tensor {
                component: component.clone(),
                tensor: r.key.clone(),
                transposed: r.transposed,
            };
            out.insert(c.tensors[r.source].key.clone(), source);
            continue;
        }
        let mut at = 0;
        for &(begin, end) in &r.rows {
            spans
                .entry(r.source)
                .or_default()
                .push((begin, end, &r.key, at));
            at += end - begin;
        }
    }
    for (i, mut spans) in spans {
        spans.sort_unstable();
        let rows_of = |key: &str| {
            let r = converted.tensors.iter().find(|r| r.key == key);
            r.and_then(|r| r.shape.first().copied()).unwrap_or(1)
        };
        let tensors = spans
            .into_iter()
            .map(|(begin, end, key, at)| match (at, end - begin) {
                (0, n) if n == rows_of(key) => TensorRows::whole(key),
                (at, n) => TensorRows::part(key, (at, at + n)),
            })
            .collect();
        let source = ArraySource::Rows {
            component: component.clone(),
            tensors,
        };
        out.insert(c.tensors[i].key.clone(), source);
    }
    out
}

/// A `[width, width]` identity matrix of `dtype`, little-endian.
///
/// # Errors
/// `dtype` is no float of 16, 32 or 64 bits.
fn identity(dtype: &crate::format::Dtype, width: u64) -> Result<Vec<u8>, String> {
    use crate::format::Dtype;
    let one: &[u8] = match dtype {
        Dtype::F64 => &[0, 0, 0, 0, 0, 0, 0xF0, 0x3F],
        Dtype::F32 => &[0, 0, 0x80, 0x3F],
        Dtype::F16 => &[0, 0x3C],
        Dtype::BF16 => &[0x80, 0x3F],
        other => return Err(format!("no identity matrix of {other}")),
    };
    let (w, n) = (width as usize, one.len());
    let mut out = vec![0u8; w * w * n];
    for i in 0..w {
        let at = (i * w + i) * n;
        out[at..at + n].copy_from_slice(one);
    }
    Ok(out)
}

/// Rows `ranges` of array `t` of the file at `path`, one after another.
fn reordered(
    path: &std::path::Path,
    t: &super::scan::SourceTensor,
    ranges: &[(u64, u64)],
) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::FileExt;
    let row = t.length / t.shape.first().copied().unwrap_or(1).max(1);
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut out = vec![0u8; t.length as usize];
    let mut at = 0;
    for &(begin, end) in ranges {
        let n = ((end - begin) * row) as usize;
        let into = out
            .get_mut(at..at + n)
            .ok_or_else(|| format!("{}: rows {begin}..{end} are not its own", t.key))?;
        file.read_exact_at(into, t.offset + begin * row)
            .map_err(|e| format!("cannot read {}: {e}", t.key))?;
        at += n;
    }
    out.truncate(at);
    Ok(out)
}

/// Array `t` of the file at `path`, a 2-D tensor, transposed.
fn transposed(path: &std::path::Path, t: &super::scan::SourceTensor) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::FileExt;
    let ([rows, cols], Some(bits)) = (t.shape.as_slice(), t.dtype.bits()) else {
        return Err(format!("{} is not a 2-D tensor of a known dtype", t.key));
    };
    let width = (bits / 8) as usize;
    let (rows, cols) = (*rows as usize, *cols as usize);
    if bits % 8 != 0 || rows * cols * width != t.length as usize {
        return Err(format!("{}: its bytes are not its shape's", t.key));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut stored = vec![0u8; t.length as usize];
    file.read_exact_at(&mut stored, t.offset)
        .map_err(|e| format!("cannot read {}: {e}", t.key))?;
    Ok(crate::decode::elem::transpose(&stored, rows, cols, width))
}

fn class_ref((library, name): &(String, String)) -> crate::format::ClassRef {
    crate::format::ClassRef {
        library: library.clone(),
        version: String::new(),
        name: name.clone(),
    }
}

/// A config map as the header holds it.
fn to_config(map: serde_json::Map<String, serde_json::Value>) -> crate::format::Config {
    use crate::format::json;
    let value = json::to_value(&super::convention::from_serde(&serde_json::Value::Object(
        map,
    )));
    match value {
        crate::format::Value::Map(entries) => entries.into_iter().collect(),
        _ => unreachable!("an object converts to a map"),
    }
}

/// The dtype holding the most bytes (its safetensors name).
fn main_dtype<'a>(tensors: impl IntoIterator<Item = &'a super::scan::SourceTensor>) -> String {
    let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
    for t in tensors {
        *bytes.entry(t.dtype.name().to_owned()).or_default() += t.length;
    }
    bytes
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(d, _)| d)
        .unwrap_or_default()
}
