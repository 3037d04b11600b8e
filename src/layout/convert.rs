//! The converters of single-file checkpoints (ComfyUI, Automatic1111, the original CompVis
//! releases) as `fs-layout/single_file.json` describes them: which converter a file's keys
//! match, and the Diffusers components its tensors become. Pure: keys and shapes in, keys and
//! shapes out, no I/O; the import (`import::single_file`) stores what this decides.
//!
//! A converter names the keys a file must hold (`require`) and, for each component, the key
//! prefix it takes and the keymap that renames what follows the prefix. A keymap is a list of
//! rules tried in order, each `[from, to?, sub?, op?]`:
//!
//! - `from` is a dotted pattern: a literal segment, `{x}` (a segment of digits, bound to `x`),
//!   and a final `*` (one or more segments, the rest);
//! - `to` is the new key: literal segments, `{expr}` (integer arithmetic `+ - * / %` over the
//!   captures and the keymap's `vars`, floor division) and `*`; absent, the key is unchanged;
//!   `null`, the tensor stays in the file's own component (the file still holds it, Diffusers
//!   does not); a list of N keys, the array's rows in N parts (a fused q/k/v: each part a
//!   contiguous byte range), equal unless the option `rows` gives their proportions (Flux's
//!   fused q/k/v/MLP projection, `[1, 1, 1, 4]`);
//! - `sub` names a keymap that renames the rest (`*`) in turn;
//! - `op` is `linear`: a `[n, m, 1, 1]` convolution kernel becomes the `[n, m]` weight of a
//!   linear layer, its bytes the same; or `transpose`: a 2-D array becomes its transpose, the
//!   one conversion that computes (OpenCLIP's `text_projection`, `x @ P` where Diffusers has a
//!   linear layer); or `swap`: the array's two halves of rows, second first (the original
//!   SD3 and Flux adaLN projections give shift then scale, Diffusers' scale then shift): two
//!   contiguous byte ranges, so the tensor is the array's bytes in another order.
//!
//! `vars` are counted over the component's keys: `["min", pattern]` the least value its first
//! capture takes, `["count", pattern]` how many distinct values it takes. So one rule serves
//! every depth of a model (layers per block, levels), as diffusers' own conversion computes
//! them from the file.
//!
//! Every other conversion only renames, reshapes, splits and reorders rows: a converted tensor
//! is row ranges of the source array's bytes, so the original file is re-created from the
//! components byte for byte (an array is row ranges of its tensors), a transposed array by
//! transposing back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::OnceLock;

use serde::Deserialize;

pub(crate) use super::recipe::TensorRows;

/// The table, as the build carries it.
const TABLE: &str = include_str!("../../fs-layout/single_file.json");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    #[allow(dead_code)]
    about: String,
    keymaps: BTreeMap<String, RawKeymap>,
    families: BTreeMap<String, serde_json::Value>,
    markers: Vec<Marker>,
    #[serde(default)]
    interfaces: BTreeMap<String, Vec<String>>,
    converters: Vec<Converter>,
}

/// Config values a file's own markers set: a ComfyUI marker array (`v_pred`, `ztsnr`) or a
/// `__metadata__` value (`modelspec.prediction_type`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Marker {
    when: MarkerWhen,
    /// Config values by component name.
    set: BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
enum MarkerWhen {
    /// The file holds an array of this name.
    Key { key: String },
    /// The file's `__metadata__` holds this key with one of these values.
    Metadata {
        metadata: String,
        equals: Vec<String>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeymap {
    #[serde(default)]
    vars: BTreeMap<String, (String, String)>,
    rules: Vec<Vec<serde_json::Value>>,
}

/// One converter of the table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Converter {
    /// Its name, as `--converter` takes it (`sd1.single_file`).
    pub name: String,
    #[allow(dead_code)]
    about: String,
    /// The family whose defaults fill what the weights cannot tell (`families`).
    pub family: String,
    /// The Diffusers pipeline class, for a converter of a whole pipeline.
    #[serde(default)]
    pub pipeline: Option<String>,
    /// Keys a file must hold to be this converter's.
    require: Vec<String>,
    /// A prefix every key of a file may carry before the converter's keys (a model alone,
    /// as ComfyUI saves it, under its checkpoint prefix `model.diffusion_model.`): such a
    /// file is read as if the prefix were not there.
    #[serde(default)]
    also_under: Option<String>,
    /// Keys a file of this converter's may not hold, each with why (a UNet with class
    /// embeddings is no model of the converter's pipelines): such a file is not converted.
    #[serde(default)]
    forbid: Vec<Forbidden>,
    /// Derived config values a converted file must have, by component: each key's allowed
    /// values (the UNet's input channels: 4, or an inpainting variant's 9).
    #[serde(default)]
    accept: BTreeMap<String, BTreeMap<String, Vec<serde_json::Value>>>,
    /// Config values, by component, that tell a lane of this converter's pipeline from
    /// another's of the same class, for its single-file face (SD 1.x's text encoder is
    /// quick-GELU, SD 2.x's GELU).
    #[serde(default)]
    single_when: BTreeMap<String, BTreeMap<String, Vec<serde_json::Value>>>,
    /// Config keys, by component, whose values a model alone must share with the component of
    /// a pipeline it joins (`import --pipeline`): the widths by which it meets the pipeline's
    /// other models (a transformer's latent channels, context and pooled widths).
    #[serde(default)]
    joins: BTreeMap<String, Vec<String>>,
    /// Other pipeline classes, for files whose derived configs have these values (an
    /// inpainting UNet's 9 input channels), tried in order.
    #[serde(default)]
    variants: Vec<Variant>,
    /// For a whole pipeline that has no offline source for some of its components (FLUX.1's
    /// T5 tokenizer): why. Such a file converts only when it joins a stored pipeline of its
    /// class (`import --pipeline`), which gives what the file lacks; without one the
    /// converter does not convert it.
    #[serde(default)]
    pub needs_pipeline: Option<String>,
    /// For such a converter, the components a joined pipeline must have, since the file has
    /// none of them (its tokenizers and scheduler).
    #[serde(default)]
    borrows: Vec<String>,
    /// Derived config values the file's models must agree on, so that they fit each other: by
    /// `component.key`, an expression of other components' values (a FLUX.1 transformer's
    /// `in_channels` is `4 * vae.latent_channels`, its latents packed 2 × 2).
    #[serde(default)]
    agree: BTreeMap<String, String>,
    /// The components, in the pipeline's order.
    pub components: Vec<ComponentRule>,
}

/// A key that rules a file out, and why.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Forbidden {
    key: String,
    why: String,
}

/// A pipeline class for files whose derived configs have values.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Variant {
    /// Config values by component name.
    when: BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    /// The pipeline class.
    pipeline: String,
}

impl Converter {
    /// The prefix before this converter's keys in a file of `arrays`: its `also_under` when
    /// some key carries it and every other is loose (under no component prefix of the table's
    /// checkpoints: `alphas_cumprod` beside a UNet saved under `model.diffusion_model.`, kept
    /// in the file), else none. A key of a checkpoint's other model (`first_stage_model.`)
    /// makes the file that checkpoint's, not a model alone.
    fn base(&self, table: &Table, arrays: &[SourceKey<'_>]) -> &str {
        let Some(p) = &self.also_under else {
            return "";
        };
        let carried = |a: &SourceKey<'_>| a.key.starts_with(p.as_str());
        if arrays.iter().any(carried) && arrays.iter().all(|a| carried(a) || table.loose(a.key)) {
            p
        } else {
            ""
        }
    }

    /// The component whose prefix, the longest that does, `key` (less the file's `also_under`
    /// prefix) starts with: the model a key of this converter's belongs to.
    fn owner(&self, key: &str) -> Option<&ComponentRule> {
        self.components
            .iter()
            .filter(|r| key.starts_with(r.prefix.as_str()))
            .max_by_key(|r| r.prefix.len())
    }

    /// This converter less the components named in `absent`: their required keys, `accept`
    /// entries and the pipeline (a checkpoint lacking a model makes none), so that what a file
    /// holds of the checkpoint can be tried alone ([`lacking`]).
    fn without(&self, absent: &BTreeSet<&str>) -> Converter {
        let mut reduced = self.clone();
        let gone = |key: &str| {
            self.owner(key)
                .is_some_and(|r| absent.contains(r.name.as_str()))
        };
        reduced.require.retain(|k| !gone(k));
        reduced
            .components
            .retain(|r| !absent.contains(r.name.as_str()));
        reduced.accept.retain(|c, _| !absent.contains(c.as_str()));
        (reduced.pipeline, reduced.needs_pipeline) = (None, None);
        reduced.variants.clear();
        reduced
    }

    /// Whether components with the `derived` configs are among the models this converter's
    /// pipelines build (`accept`).
    ///
    /// # Errors
    /// The first value that is not allowed, with the values that are.
    pub(crate) fn accepts(
        &self,
        derived: &BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(), String> {
        for (component, keys) in &self.accept {
            for (key, allowed) in keys {
                let value = derived.get(component).and_then(|c| c.get(key));
                if !value.is_some_and(|v| allowed.contains(v)) {
                    let shown: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
                    return Err(format!(
                        "{component}'s {key} is {}, and this converter takes {}",
                        value.map_or("missing".into(), |v| v.to_string()),
                        shown.join(" or ")
                    ));
                }
            }
        }
        Ok(())
    }

    /// The components a pipeline this converter's file joins must have (`borrows`), by the
    /// first it lacks.
    ///
    /// # Errors
    /// The first component of `borrows` that `header` has not.
    pub(crate) fn lends(&self, header: &crate::format::Header) -> Result<(), String> {
        match self.borrows.iter().find(|b| header.component(b).is_none()) {
            None => Ok(()),
            Some(missing) => Err(format!(
                "it has no {missing}, which {} takes from it",
                self.name
            )),
        }
    }

    /// Whether the `derived` configs of a file's models agree as `agree` says, so that the
    /// models fit each other; a value that is not there, or not an integer, is not checked.
    ///
    /// # Errors
    /// The first value that differs from what its expression makes.
    pub(crate) fn agrees(
        &self,
        derived: &BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(), String> {
        let env: HashMap<String, i64> = derived
            .iter()
            .flat_map(|(c, config)| {
                config.iter().filter_map(move |(k, v)| {
                    let v = v.as_i64().or_else(|| v.as_bool().map(i64::from))?;
                    Some((format!("{c}.{k}"), v))
                })
            })
            .collect();
        for (name, text) in &self.agree {
            let expr = parse_expr(text).map_err(|e| format!("agree {name}: {e}"))?;
            let (Some(&have), Some(want)) = (env.get(name), expr.eval(&env)) else {
                continue;
            };
            if have != want {
                return Err(format!(
                    "its models do not fit each other: {name} is {have}, and {text} is {want}"
                ));
            }
        }
        Ok(())
    }

    /// The pipeline classes this converter makes: its own, then its variants'.
    pub(crate) fn pipelines(&self) -> impl Iterator<Item = &str> {
        self.pipeline
            .as_deref()
            .into_iter()
            .chain(self.variants.iter().map(|v| v.pipeline.as_str()))
    }

    /// The config keys a model alone must share with a pipeline it joins, as (component,
    /// key): those `accept` constrains, and `joins`.
    pub(crate) fn joined_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        let accepted = self
            .accept
            .iter()
            .flat_map(|(c, keys)| keys.keys().map(move |k| (c.as_str(), k.as_str())));
        let joined = self
            .joins
            .iter()
            .flat_map(|(c, keys)| keys.iter().map(move |k| (c.as_str(), k.as_str())));
        accepted.chain(joined)
    }

    /// The pipeline class for a file whose components have the `derived` configs: the first
    /// variant whose values they all have, else the converter's; `None` for a converter of a
    /// component alone.
    pub(crate) fn pipeline_for(
        &self,
        derived: &BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    ) -> Option<&str> {
        let default = self.pipeline.as_deref()?;
        let fits = |v: &Variant| {
            v.when.iter().all(|(component, values)| {
                values
                    .iter()
                    .all(|(k, want)| derived.get(component).and_then(|c| c.get(k)) == Some(want))
            })
        };
        Some(
            self.variants
                .iter()
                .find(|v| fits(v))
                .map_or(default, |v| &v.pipeline),
        )
    }
}

/// One component of a converter.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ComponentRule {
    /// The Diffusers component name (`unet`).
    pub name: String,
    /// The key prefix its tensors have in the file.
    pub prefix: String,
    /// The keymap that renames the rest of each key.
    keymap: String,
    /// The keymap that renames a Diffusers component's keys back to the file's (less the
    /// prefix), for a lane's single-file face ([`reverse`]).
    #[serde(default)]
    reverse: Option<String>,
    /// `[library, class]`.
    pub class: (String, String),
    /// Square identity matrices the component has that the file does not, by key, each as
    /// wide as the first extent of the converted tensor named (SD3's CLIP-L, whose pooled
    /// output goes unprojected, is a `CLIPTextModelWithProjection` with an identity
    /// projection in Diffusers).
    #[serde(default)]
    identity: BTreeMap<String, String>,
}

/// The table, parsed and checked once.
pub(crate) struct Table {
    keymaps: HashMap<String, Keymap>,
    /// Family defaults by name (`sd1`), as written in the table.
    pub families: BTreeMap<String, serde_json::Value>,
    /// Markers, in the table's order.
    markers: Vec<Marker>,
    /// By model class (`AutoencoderKL`), the config keys whose values a model must share with
    /// the one it stands in for in a pipeline (`import --component`): the widths by which it
    /// meets the pipeline's other models (a VAE's latent channels, a text encoder's width).
    pub interfaces: BTreeMap<String, Vec<String>>,
    /// The converters, in the table's order.
    pub converters: Vec<Converter>,
}

struct Keymap {
    /// Each var: its name, kind, pattern and the pattern's text (for messages).
    vars: Vec<(String, VarKind, Pattern, String)>,
    rules: Vec<Rule>,
}

#[derive(Clone, Copy)]
enum VarKind {
    Min,
    Count,
}

struct Rule {
    from: Pattern,
    to: Target,
    sub: Option<String>,
    op: Op,
    /// The other keys one array is made of, after the matched one, as templates over the
    /// captures (a reverse keymap's fused `in_proj_weight` of `q_proj`, `k_proj`, `v_proj`).
    with: Vec<Vec<TSeg>>,
    /// The rule applies only when the component has a key starting with this template's
    /// value (a reverse keymap's upsampler slot, which depends on whether its level attends).
    when: Option<Vec<TSeg>>,
    /// For N target keys, the proportions of the array's rows each takes (empty: equal).
    rows: Vec<u64>,
}

/// What a rule does to an array's shape (and, for a transpose, its bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Nothing.
    Same,
    /// A `[n, m, 1, 1]` kernel read as an `[n, m]` weight.
    Linear,
    /// A 2-D array transposed.
    Transpose,
    /// An `[n, m]` linear weight written as an `[n, m, 1, 1]` kernel (`linear` reversed).
    Kernel,
    /// The rows' two halves exchanged (its own reverse).
    Swap,
}

enum Target {
    Same,
    Kept,
    /// One key, or N for the array's rows in N parts.
    Keys(Vec<Vec<TSeg>>),
}

type Pattern = Vec<PSeg>;

#[derive(Debug)]
enum PSeg {
    Lit(String),
    /// `{x}`: an index, captured as `x`.
    Int(String),
    /// `{expr}` (with an operator): the index the expression's value is (`{L-1}`, a list's
    /// last module), over the keymap's vars.
    Value(Expr),
    Rest,
}

enum TSeg {
    Lit(String),
    Expr(Expr),
    Rest,
}

#[derive(Debug)]
enum Expr {
    Num(i64),
    Name(String),
    Op(char, Box<Expr>, Box<Expr>),
}

/// The table as the build carries it.
///
/// # Panics
/// The bundled table does not parse (a build defect the tests catch).
pub(crate) fn table() -> &'static Table {
    static TABLE_ONCE: OnceLock<Table> = OnceLock::new();
    TABLE_ONCE.get_or_init(|| parse_table(TABLE).expect("fs-layout/single_file.json"))
}

fn parse_table(text: &str) -> Result<Table, String> {
    let raw: RawTable = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut keymaps = HashMap::new();
    for (name, k) in &raw.keymaps {
        let mut vars = Vec::new();
        for (var, (kind, pattern)) in &k.vars {
            let kind = match kind.as_str() {
                "min" => VarKind::Min,
                "count" => VarKind::Count,
                other => return Err(format!("keymap {name}: var {var}: no kind {other:?}")),
            };
            vars.push((var.clone(), kind, parse_pattern(pattern)?, pattern.clone()));
        }
        let rules = k
            .rules
            .iter()
            .map(|r| parse_rule(r).map_err(|why| format!("keymap {name}: rule {r:?}: {why}")))
            .collect::<Result<_, _>>()?;
        keymaps.insert(name.clone(), Keymap { vars, rules });
    }
    for k in keymaps.values() {
        for rule in &k.rules {
            if let Some(sub) = rule.sub.as_ref().filter(|s| !keymaps.contains_key(*s)) {
                return Err(format!("no keymap {sub:?}"));
            }
        }
    }
    for c in &raw.converters {
        if !raw.families.contains_key(&c.family) {
            return Err(format!("{}: no family {:?}", c.name, c.family));
        }
        for (name, text) in &c.agree {
            parse_expr(text).map_err(|e| format!("{}: agree {name}: {e}", c.name))?;
        }
        if let Some(r) = c
            .components
            .iter()
            .flat_map(|r| std::iter::once(&r.keymap).chain(&r.reverse))
            .find(|k| !keymaps.contains_key(*k))
        {
            return Err(format!("{}: no keymap {r:?}", c.name));
        }
        // A lane's matrices are not read to make its single file: they could be any.
        if let Some(r) = c
            .components
            .iter()
            .find(|r| r.reverse.is_some() && !r.identity.is_empty())
        {
            return Err(format!(
                "{}: {} makes identity matrices and so has no reverse keymap",
                c.name, r.name
            ));
        }
    }
    Ok(Table {
        keymaps,
        families: resolve_families(&raw.families)?,
        markers: raw.markers,
        interfaces: raw.interfaces,
        converters: raw.converters,
    })
}

/// The families with each `base` resolved: a family is its base's entries, each of its own
/// replacing the base's (`null` removing it).
///
/// # Errors
/// A family names a base that is no family, or bases form a cycle.
fn resolve_families(
    raw: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, serde_json::Value>, String> {
    use serde_json::Value as J;
    fn resolve(
        raw: &BTreeMap<String, J>,
        name: &str,
        seen: &mut Vec<String>,
    ) -> Result<serde_json::Map<String, J>, String> {
        if seen.iter().any(|s| s == name) {
            return Err(format!("family bases form a cycle: {}", seen.join(" → ")));
        }
        seen.push(name.to_owned());
        let Some(J::Object(own)) = raw.get(name) else {
            return Err(format!("no family {name:?}"));
        };
        let mut out = match own.get("base").and_then(J::as_str) {
            Some(base) => resolve(raw, base, seen)?,
            None => serde_json::Map::new(),
        };
        for (k, v) in own {
            match v {
                _ if k == "base" => {}
                J::Null => {
                    out.remove(k);
                }
                v => {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(out)
    }
    raw.keys()
        .map(|name| {
            Ok((
                name.clone(),
                J::Object(resolve(raw, name, &mut Vec::new())?),
            ))
        })
        .collect()
}

fn parse_rule(r: &[serde_json::Value]) -> Result<Rule, String> {
    use serde_json::Value as J;
    let text = |v: Option<&J>| match v {
        None | Some(J::Null) => Ok(None),
        Some(J::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{other} is not a string")),
    };
    let from = match r.first() {
        Some(J::String(s)) => parse_pattern(s)?,
        _ => return Err("no pattern".into()),
    };
    let to = match r.get(1) {
        None => Target::Same,
        Some(J::Null) => Target::Kept,
        Some(J::String(s)) => Target::Keys(vec![parse_target(s)?]),
        Some(J::Array(keys)) if keys.len() >= 2 => Target::Keys(
            keys.iter()
                .map(|k| match k {
                    J::String(s) => parse_target(s),
                    other => Err(format!("target {other} is not a string")),
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(other) => return Err(format!("target {other} is not a string")),
    };
    let sub = text(r.get(2))?;
    let op = match text(r.get(3))?.as_deref() {
        None => Op::Same,
        Some("linear") => Op::Linear,
        Some("transpose") => Op::Transpose,
        Some("kernel") => Op::Kernel,
        Some("swap") => Op::Swap,
        Some(other) => return Err(format!("no op {other:?}")),
    };
    let (mut with, mut when, mut rows) = (Vec::new(), None, Vec::new());
    match r.get(4) {
        None => {}
        Some(J::Object(fields)) => {
            for (name, value) in fields {
                match (name.as_str(), value) {
                    ("with", J::Array(keys)) => {
                        for k in keys {
                            let J::String(k) = k else {
                                return Err(format!("with: {k} is not a string"));
                            };
                            with.push(parse_target(k)?);
                        }
                    }
                    ("if", J::String(prefix)) => when = Some(parse_target(prefix)?),
                    ("rows", J::Array(weights)) => {
                        for w in weights {
                            match w.as_u64() {
                                Some(w) if w > 0 => rows.push(w),
                                _ => return Err(format!("rows: {w} is no positive count")),
                            }
                        }
                    }
                    _ => return Err(format!("no option {name:?} taking {value}")),
                }
            }
        }
        Some(other) => return Err(format!("options {other} are not an object")),
    }
    if r.len() > 5 {
        return Err("more than five fields".into());
    }
    if !with.is_empty() && (sub.is_some() || !matches!(&to, Target::Keys(keys) if keys.len() == 1))
    {
        return Err("a rule that fuses arrays names one key and no sub-keymap".into());
    }
    if sub.is_some() && !matches!(from.last(), Some(PSeg::Rest)) {
        return Err("a sub-keymap needs a pattern ending in *".into());
    }
    if matches!(&to, Target::Keys(keys) if keys.len() > 1) && op != Op::Same {
        return Err("a split array takes no op".into());
    }
    if !rows.is_empty() && !matches!(&to, Target::Keys(keys) if keys.len() == rows.len()) {
        return Err("rows gives a proportion for each of a rule's keys".into());
    }
    Ok(Rule {
        from,
        to,
        sub,
        op,
        with,
        when,
        rows,
    })
}

fn parse_pattern(text: &str) -> Result<Pattern, String> {
    let segments: Vec<&str> = text.split('.').collect();
    let mut out = Vec::with_capacity(segments.len());
    for (i, s) in segments.iter().enumerate() {
        out.push(match *s {
            "*" if i + 1 == segments.len() => PSeg::Rest,
            "*" => return Err(format!("{text:?}: * must be the last segment")),
            s if s.starts_with('{') && s.ends_with('}') => {
                let inner = &s[1..s.len() - 1];
                if !inner.is_empty() && inner.chars().all(|c| c.is_ascii_alphabetic()) {
                    PSeg::Int(inner.to_owned())
                } else {
                    PSeg::Value(parse_expr(inner).map_err(|why| format!("{text:?}: {why}"))?)
                }
            }
            s => PSeg::Lit(s.to_owned()),
        });
    }
    Ok(out)
}

fn parse_target(text: &str) -> Result<Vec<TSeg>, String> {
    text.split('.')
        .map(|s| match s {
            "*" => Ok(TSeg::Rest),
            s if s.starts_with('{') && s.ends_with('}') => Ok(TSeg::Expr(
                parse_expr(&s[1..s.len() - 1]).map_err(|why| format!("{text:?}: {why}"))?,
            )),
            s => Ok(TSeg::Lit(s.to_owned())),
        })
        .collect()
}

/// `expr := term (('+'|'-') term)*`, `term := atom (('*'|'/'|'%') atom)*`,
/// `atom := number | name | '(' expr ')'`.
fn parse_expr(text: &str) -> Result<Expr, String> {
    let tokens: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    let mut at = 0;
    let e = expr(&tokens, &mut at)?;
    if at != tokens.len() {
        return Err(format!("unexpected {:?} in {text:?}", tokens[at]));
    }
    Ok(e)
}

fn expr(t: &[char], at: &mut usize) -> Result<Expr, String> {
    let mut left = term(t, at)?;
    while let Some(&op) = t.get(*at).filter(|c| **c == '+' || **c == '-') {
        *at += 1;
        left = Expr::Op(op, Box::new(left), Box::new(term(t, at)?));
    }
    Ok(left)
}

fn term(t: &[char], at: &mut usize) -> Result<Expr, String> {
    let mut left = atom(t, at)?;
    while let Some(&op) = t.get(*at).filter(|c| matches!(**c, '*' | '/' | '%')) {
        *at += 1;
        left = Expr::Op(op, Box::new(left), Box::new(atom(t, at)?));
    }
    Ok(left)
}

fn atom(t: &[char], at: &mut usize) -> Result<Expr, String> {
    match t.get(*at) {
        Some('(') => {
            *at += 1;
            let e = expr(t, at)?;
            if t.get(*at) != Some(&')') {
                return Err("a ( is not closed".into());
            }
            *at += 1;
            Ok(e)
        }
        Some(c) if c.is_ascii_digit() => {
            let start = *at;
            while t.get(*at).is_some_and(char::is_ascii_digit) {
                *at += 1;
            }
            let text: String = t[start..*at].iter().collect();
            text.parse().map(Expr::Num).map_err(|e| e.to_string())
        }
        Some(c) if c.is_ascii_alphabetic() => {
            let start = *at;
            // Keymap vars are letters (`i`, `L`); converters' `agree` names config values
            // (`vae.latent_channels`).
            while t
                .get(*at)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
            {
                *at += 1;
            }
            Ok(Expr::Name(t[start..*at].iter().collect()))
        }
        Some(c) => Err(format!("unexpected {c:?}")),
        None => Err("an expression ends early".into()),
    }
}

impl Expr {
    /// The value, or `None` when a name is unbound, a division is by zero or the value is
    /// negative (no key has a negative index).
    fn eval(&self, env: &HashMap<String, i64>) -> Option<i64> {
        let v = match self {
            Expr::Num(n) => *n,
            Expr::Name(name) => *env.get(name)?,
            Expr::Op(op, a, b) => {
                let (a, b) = (a.eval(env)?, b.eval(env)?);
                match op {
                    '+' => a.checked_add(b)?,
                    '-' => a.checked_sub(b)?,
                    '*' => a.checked_mul(b)?,
                    '/' => a.checked_div_euclid(b)?,
                    '%' => a.checked_rem_euclid(b)?,
                    _ => return None,
                }
            }
        };
        (v >= 0).then_some(v)
    }
}

/// A pattern's captures (name, value) and the rest a final `*` took.
type Match = (Vec<(String, i64)>, Option<String>);

/// Matches `key`'s segments against `pattern`, whose computed indices see `vars`: the
/// captures, and the rest for a final `*`.
fn matches(pattern: &Pattern, key: &[&str], vars: &HashMap<String, i64>) -> Option<Match> {
    let mut captures = Vec::new();
    for (i, p) in pattern.iter().enumerate() {
        match p {
            // The rest is one or more segments, none of them empty.
            PSeg::Rest => {
                let rest = &key[i.min(key.len())..];
                return (!rest.is_empty() && rest.iter().all(|s| !s.is_empty()))
                    .then(|| (captures, Some(rest.join("."))));
            }
            PSeg::Lit(lit) => {
                if key.get(i) != Some(&lit.as_str()) {
                    return None;
                }
            }
            PSeg::Int(name) => captures.push((name.clone(), index(key.get(i)?)?)),
            PSeg::Value(expr) => {
                if index(key.get(i)?)? != expr.eval(vars)? {
                    return None;
                }
            }
        }
    }
    (pattern.len() == key.len()).then_some((captures, None))
}

/// An index as Python writes one: digits, no leading zero.
fn index(segment: &str) -> Option<i64> {
    let plain = !segment.is_empty()
        && segment.bytes().all(|b| b.is_ascii_digit())
        && !(segment.len() > 1 && segment.starts_with('0'));
    plain.then(|| segment.parse().ok()).flatten()
}

/// What a keymap makes of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mapped {
    /// The new key (N keys: the array's rows in N parts, in proportions `rows`, empty for
    /// equal ones), and what happens to its shape; `with`: the other keys whose rows follow
    /// this one's in the new array (a fused array).
    Keys {
        keys: Vec<String>,
        op: Op,
        with: Vec<String>,
        rows: Vec<u64>,
    },
    /// The key stays in the file's own component.
    Kept,
}

/// A template's value under `env`; `None` when an expression has no value.
fn instantiate(
    segments: &[TSeg],
    env: &HashMap<String, i64>,
    rest: Option<&str>,
) -> Option<String> {
    let mut out = Vec::with_capacity(segments.len());
    for s in segments {
        out.push(match s {
            TSeg::Lit(l) => l.clone(),
            TSeg::Expr(e) => e.eval(env)?.to_string(),
            TSeg::Rest => rest?.to_owned(),
        });
    }
    Some(out.join("."))
}

impl Table {
    /// `key` (without its component's prefix) through keymap `name`, with `vars` bound;
    /// `present` says whether the component has a key starting with a text (rules' `if`).
    fn map(
        &self,
        name: &str,
        key: &str,
        vars: &HashMap<String, i64>,
        present: &dyn Fn(&str) -> bool,
    ) -> Option<Mapped> {
        let keymap = &self.keymaps[name];
        let segments: Vec<&str> = key.split('.').collect();
        for rule in &keymap.rules {
            let Some((captures, rest)) = matches(&rule.from, &segments, vars) else {
                continue;
            };
            let mut env = vars.clone();
            env.extend(captures);
            if let Some(when) = &rule.when {
                if !present(&instantiate(when, &env, None)?) {
                    continue;
                }
            }
            // The keys a sub-keymap fuses with the rest, as keys of this keymap.
            let mut fused = Vec::new();
            let rest = match (&rule.sub, rest) {
                // A sub-keymap renames one key (or fuses it with others); it neither splits nor
                // computes.
                (Some(sub), Some(rest)) => match self.map(sub, &rest, vars, present)? {
                    Mapped::Keys {
                        mut keys, op, with, ..
                    } if keys.len() == 1 && op != Op::Transpose => {
                        let head = segments[..rule.from.len() - 1].join(".");
                        fused = with
                            .into_iter()
                            .map(|w| match head.is_empty() {
                                true => w,
                                false => format!("{head}.{w}"),
                            })
                            .collect();
                        Some((keys.remove(0), op))
                    }
                    Mapped::Keys { .. } => return None,
                    Mapped::Kept => return Some(Mapped::Kept),
                },
                (_, rest) => rest.map(|r| (r, Op::Same)),
            };
            let op = match (rule.op, &rest) {
                (Op::Same, Some((_, inner))) => *inner,
                (op, _) => op,
            };
            let keys = match &rule.to {
                Target::Kept => return Some(Mapped::Kept),
                Target::Same if rule.sub.is_none() => vec![key.to_owned()],
                Target::Same => {
                    let head: Vec<&str> = segments[..rule.from.len() - 1].to_vec();
                    vec![format!("{}.{}", head.join("."), rest.as_ref()?.0)]
                }
                Target::Keys(targets) => {
                    let mut keys = Vec::with_capacity(targets.len());
                    for segments in targets {
                        let mut out = Vec::with_capacity(segments.len());
                        for s in segments {
                            out.push(match s {
                                TSeg::Lit(l) => l.clone(),
                                TSeg::Expr(e) => e.eval(&env)?.to_string(),
                                TSeg::Rest => rest.as_ref()?.0.clone(),
                            });
                        }
                        keys.push(out.join("."));
                    }
                    keys
                }
            };
            let mut with = rule
                .with
                .iter()
                .map(|t| instantiate(t, &env, None))
                .collect::<Option<Vec<_>>>()?;
            with.extend(fused);
            return Some(Mapped::Keys {
                keys,
                op,
                with,
                rows: rule.rows.clone(),
            });
        }
        None
    }

    /// The indices the rule that takes `key` captures, each with the key's segments before it.
    fn indexed(&self, name: &str, key: &str, vars: &HashMap<String, i64>) -> Vec<(String, i64)> {
        let segments: Vec<&str> = key.split('.').collect();
        for rule in &self.keymaps[name].rules {
            if let Some((captures, _)) = matches(&rule.from, &segments, vars) {
                let places = rule
                    .from
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| matches!(p, PSeg::Int(_)));
                return places
                    .zip(captures)
                    .map(|((at, _), (_, n))| (segments[..at].join("."), n))
                    .collect();
            }
        }
        Vec::new()
    }

    /// The keymap's vars, counted over `keys`.
    fn vars(&self, name: &str, keys: &[&str]) -> Result<HashMap<String, i64>, String> {
        let mut out = HashMap::new();
        for (var, kind, pattern, text) in &self.keymaps[name].vars {
            let mut values = BTreeSet::new();
            for key in keys {
                let segments: Vec<&str> = key.split('.').collect();
                if let Some((captures, _)) = matches(pattern, &segments, &HashMap::new()) {
                    if let Some((_, v)) = captures.first() {
                        values.insert(*v);
                    }
                }
            }
            let value = match kind {
                VarKind::Min => *values
                    .first()
                    .ok_or_else(|| format!("no key gives {var} (none is like {text})"))?,
                VarKind::Count => values.len() as i64,
            };
            out.insert(var.clone(), value);
        }
        Ok(out)
    }
}

impl Table {
    /// The config values a file's markers set, by component: those of its `__metadata__`
    /// over those of its marker arrays (a producer's statement over a loader's convention).
    pub(crate) fn marked(
        &self,
        keys: &BTreeSet<&str>,
        metadata: &[(String, String)],
    ) -> BTreeMap<String, serde_json::Map<String, serde_json::Value>> {
        let mut out: BTreeMap<String, serde_json::Map<String, serde_json::Value>> = BTreeMap::new();
        let by_key = self.markers.iter().filter(|m| match &m.when {
            MarkerWhen::Key { key } => keys.contains(key.as_str()),
            MarkerWhen::Metadata { .. } => false,
        });
        let by_metadata = self.markers.iter().filter(|m| match &m.when {
            MarkerWhen::Metadata {
                metadata: name,
                equals,
            } => metadata
                .iter()
                .any(|(k, v)| k == name && equals.iter().any(|e| e == v)),
            MarkerWhen::Key { .. } => false,
        });
        for marker in by_key.chain(by_metadata) {
            for (component, values) in &marker.set {
                out.entry(component.clone())
                    .or_default()
                    .extend(values.clone());
            }
        }
        out
    }
}

/// Where a component's numbered modules skip one: `indexed` holds, for each key, each index
/// a rule captured (`{i}`) with the key's segments before it. PyTorch numbers a `ModuleList`'s
/// children 0, 1, … with none missing, so a hole between the least and the greatest index of
/// one list (a block left out, a stray key's index) means the file is not the model it looks
/// like. (Only captured indices count: `time_embed.0` and `time_embed.2` are one module's
/// children around a parameterless one.)
fn gap(prefix: &str, indexed: &[(String, i64)]) -> Option<String> {
    let mut lists: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for (list, n) in indexed {
        lists.entry(list).or_default().insert(*n);
    }
    lists.into_iter().find_map(|(list, indices)| {
        let (first, last) = (*indices.first()?, *indices.last()?);
        let missing = (first..last).find(|n| !indices.contains(n))?;
        Some(format!(
            "{prefix}{list}.{last} is there but not {prefix}{list}.{missing}"
        ))
    })
}

/// A source array as the converter sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SourceKey<'a> {
    /// Its name in the file.
    pub key: &'a str,
    /// Its shape in the file.
    pub shape: &'a [u64],
}

/// One converted tensor: source array `source` as `key` with `shape`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Renamed {
    /// Index into the source arrays.
    pub source: usize,
    /// Its Diffusers (or Transformers) key.
    pub key: String,
    /// Its shape there: the source's, a 1×1 kernel's as a linear weight, a row part's, or
    /// transposed.
    pub shape: Vec<u64>,
    /// The array's row ranges `[begin, end)` whose bytes, one after another, are the
    /// tensor's; empty for the whole array (a split array's part is one range, a swapped
    /// array two).
    pub rows: Vec<(u64, u64)>,
    /// Whether its bytes are the array's transposed.
    pub transposed: bool,
}

/// A component a file's arrays become.
#[derive(Debug)]
pub(crate) struct Converted<'t> {
    /// The component's rule.
    pub rule: &'t ComponentRule,
    /// Its tensors, in the file's data order (the import sorts them as Diffusers writes them).
    pub tensors: Vec<Renamed>,
    /// Its identity matrices ([`ComponentRule`]'s `identity`): each as `key`, `shape` `[w,
    /// w]`, and `source` the array whose dtype it has; no bytes of the file.
    pub identities: Vec<Renamed>,
}

/// A file's arrays, converted.
#[derive(Debug)]
pub(crate) struct Conversion<'t> {
    /// The converter.
    pub converter: &'t Converter,
    /// Each of its components.
    pub components: Vec<Converted<'t>>,
    /// Arrays that stay in the file's own component (under no prefix, or kept by a rule).
    pub kept: Vec<usize>,
    /// Why converters that take the file but convert only joining a stored pipeline
    /// (`needs_pipeline`) did not, each naming its converter: what `--pipeline` would add.
    pub passed_over: Vec<String>,
}

/// What the table makes of a file.
#[derive(Debug)]
pub(crate) enum Outcome<'t> {
    /// No converter's required keys are all there, nor its main model's: the file imports
    /// as it is.
    Unknown,
    /// A converter's main model is there (its first required key) but not all it requires,
    /// as in a checkpoint saved without one of its models (what is missing): the file
    /// imports as it is.
    Lacking(String),
    /// The file is this converter's.
    Converted(Conversion<'t>),
    /// A converter's keys are there, but it cannot convert the file (why): it imports as it is.
    Unconverted(String),
}

/// The converter called `name`, if the table has one.
pub(crate) fn named(name: &str) -> Option<&'static Converter> {
    table().converters.iter().find(|c| c.name == name)
}

/// Recognises `arrays` (a file's, in data order) by the table: the converter named `named`
/// if given, else the converter that takes the file (every key of its `require` is there,
/// under its `also_under` prefix when every key carries it) and converts it, with `check`
/// (the configs the conversion derives, and the converter's `accept`) passing. Converters
/// that share required keys are told apart by converting: a UNet alone of SD 1.x and of
/// SDXL differ in their context width.
///
/// # Errors
/// Several converters convert the file and none is named; or the named converter cannot
/// convert the file.
pub(crate) fn recognise<'t>(
    table: &'t Table,
    arrays: &[SourceKey<'_>],
    named: Option<&'t Converter>,
    check: &dyn Fn(&Conversion<'_>) -> Result<(), String>,
) -> Result<Outcome<'t>, String> {
    let attempt = |c: &'t Converter| convert(table, c, arrays).and_then(|v| check(&v).map(|()| v));
    if let Some(c) = named {
        return attempt(c)
            .map(Outcome::Converted)
            .map_err(|why| format!("--converter {}: {why}", c.name));
    }
    let keys: BTreeSet<&str> = arrays.iter().map(|a| a.key).collect();
    let takers: Vec<&Converter> = table
        .converters
        .iter()
        .filter(|c| {
            let base = c.base(table, arrays);
            c.require
                .iter()
                .all(|k| keys.contains(format!("{base}{k}").as_str()))
        })
        .collect();
    let mut converted = Vec::new();
    let mut refused = Vec::new();
    let mut passed_over = Vec::new();
    for c in &takers {
        match attempt(c) {
            Ok(v) => converted.push(v),
            Err(why) => {
                if c.needs_pipeline.is_some() {
                    passed_over.push(format!("{}: {why}", c.name));
                }
                refused.push(format!("{}: {why}", c.name));
            }
        }
    }
    match (takers.len(), converted.len()) {
        (0, _) => {
            Ok(lacking(table, arrays, &keys, check).map_or(Outcome::Unknown, Outcome::Lacking))
        }
        (_, 1) => {
            let mut conversion = converted.pop().expect("one");
            conversion.passed_over = passed_over;
            Ok(Outcome::Converted(conversion))
        }
        (_, 0) => Ok(Outcome::Unconverted(refused.join("; "))),
        _ => {
            let names: Vec<&str> = converted
                .iter()
                .map(|c| c.converter.name.as_str())
                .collect();
            Err(format!(
                "the file is like several single-file checkpoints ({}); pass --converter NAME \
                 to say which",
                names.join(", ")
            ))
        }
    }
}

/// The models a file lacks for a whole checkpoint. Candidates are the converters whose first
/// required key (their main model's) is there, that forbid no key the file holds, and whose
/// other missing required keys each lie under a model's prefix that no key of the file has.
/// Where a converter of a model alone takes the file's main model (told by its width, as an
/// SDXL UNet by its 2048-wide context), only candidates of that converter's family stay. Each
/// is tried on what the file holds (the converter [`without`](Converter::without) those
/// models, with `check`): named are those that convert it, leaving the fewest arrays in the
/// file, then missing the fewest models; or else, when none does, those missing the fewest,
/// with why. A file with part of every model
/// (truncated, or another kind of file), or whose main model's family has no candidate,
/// lacks nothing here: it is unknown.
fn lacking(
    table: &Table,
    arrays: &[SourceKey<'_>],
    keys: &BTreeSet<&str>,
    check: &dyn Fn(&Conversion<'_>) -> Result<(), String>,
) -> Option<String> {
    /// A converter, its absent models as said, and whether what is there converts, leaving
    /// how many arrays in the file (or why not).
    struct Candidate<'c> {
        converter: &'c Converter,
        said: Vec<String>,
        converts: Result<usize, String>,
    }
    let tried = |c: &Converter, arrays: &[SourceKey<'_>]| {
        convert(table, c, arrays).and_then(|v| check(&v).map(|()| v.kept.len()))
    };
    // The families whose converters of a model alone take the main model (`unet`) as it is
    // under their checkpoint prefix.
    let families_of = |main: &str| -> BTreeSet<&str> {
        let alone = table.converters.iter().filter(|a| {
            a.pipeline.is_none() && matches!(a.components.as_slice(), [r] if r.name == main)
        });
        alone
            .filter_map(|a| {
                let p = a.also_under.as_deref()?;
                let part: Vec<SourceKey<'_>> = arrays
                    .iter()
                    .filter(|x| x.key.starts_with(p))
                    .copied()
                    .collect();
                (!part.is_empty() && tried(a, &part).is_ok()).then_some(a.family.as_str())
            })
            .collect()
    };
    let mut told: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    'converters: for c in &table.converters {
        let base = c.base(table, arrays);
        let there = |k: &String| keys.contains(format!("{base}{k}").as_str());
        let Some(main) = c.require.first().filter(|k| there(k)) else {
            continue;
        };
        if c.forbid.iter().any(|f| there(&f.key)) {
            continue;
        }
        let mut absent: BTreeSet<&str> = BTreeSet::new();
        let mut said: Vec<String> = Vec::new();
        for key in c.require.iter().filter(|k| !there(k)) {
            let Some(model) = c.owner(key) else {
                continue 'converters;
            };
            let prefix = format!("{base}{}", model.prefix);
            if keys.iter().any(|k| k.starts_with(prefix.as_str())) {
                continue 'converters;
            }
            if absent.insert(model.name.as_str()) {
                said.push(format!("{} (no key starts with {prefix:?})", model.name));
            }
        }
        if absent.is_empty() {
            continue;
        }
        let main_model = c.owner(main).map_or("", |r| r.name.as_str());
        let families = told
            .entry(main_model)
            .or_insert_with(|| families_of(main_model));
        if !families.is_empty() && !families.contains(c.family.as_str()) {
            continue;
        }
        candidates.push(Candidate {
            converter: c,
            said,
            converts: tried(&c.without(&absent), arrays),
        });
    }
    // Those that convert what is there, of them those that take the most of it (an SDXL file
    // without CLIP-L is no refiner's, which would leave its CLIP-G in the file), then those
    // missing the fewest models.
    let converting = candidates.iter().any(|c| c.converts.is_ok());
    candidates.retain(|c| c.converts.is_ok() == converting);
    if let Some(least) = candidates
        .iter()
        .filter_map(|c| c.converts.as_ref().ok())
        .min()
    {
        let least = *least;
        candidates.retain(|c| c.converts.as_ref().is_ok_and(|&kept| kept == least));
    }
    let fewest = candidates.iter().map(|c| c.said.len()).min()?;
    candidates.retain(|c| c.said.len() == fewest);
    let like: Vec<String> = candidates
        .iter()
        .map(|c| {
            let said = c.said.join(" and ");
            format!("{} without its {said}", c.converter.name)
        })
        .collect();
    let mut why = format!(
        "it is like a checkpoint of {}; a checkpoint that lacks a model is not converted",
        like.join(", or of ")
    );
    if !converting {
        let not: Vec<String> = candidates
            .iter()
            .filter_map(|c| {
                let why = c.converts.as_ref().err()?;
                Some(format!("{}: {why}", c.converter.name))
            })
            .collect();
        why.push_str(&format!(
            ", and what it holds would not convert either ({})",
            not.join("; ")
        ));
    }
    Some(why)
}

fn convert<'t>(
    table: &'t Table,
    converter: &'t Converter,
    arrays: &[SourceKey<'_>],
) -> Result<Conversion<'t>, String> {
    let base = converter.base(table, arrays);
    // Some keys under the checkpoint prefix, but not read under it: another model's key beside.
    if let Some(p) = converter.also_under.as_deref().filter(|_| base.is_empty()) {
        if arrays.iter().any(|a| a.key.starts_with(p)) {
            let other = arrays
                .iter()
                .find(|a| !a.key.starts_with(p) && !table.loose(a.key));
            if let Some(other) = other {
                return Err(format!(
                    "keys carry the checkpoint prefix {p:?}, and {} carries another model's; a \
                     model alone under its checkpoint prefix holds no other model's arrays",
                    other.key
                ));
            }
        }
    }
    if let Some(f) = converter.forbid.iter().find(|f| {
        arrays
            .iter()
            .any(|a| a.key.strip_prefix(base) == Some(f.key.as_str()))
    }) {
        return Err(format!("it holds {base}{}: {}", f.key, f.why));
    }
    let prefixes: Vec<String> = converter
        .components
        .iter()
        .map(|r| format!("{base}{}", r.prefix))
        .collect();
    let mut owner: Vec<Option<usize>> = vec![None; arrays.len()];
    // The longest prefix takes a key (a component's prefix may contain another's).
    for (i, a) in arrays.iter().enumerate() {
        owner[i] = prefixes
            .iter()
            .enumerate()
            .filter(|(_, p)| a.key.starts_with(p.as_str()))
            .max_by_key(|(_, p)| p.len())
            .map(|(c, _)| c);
    }
    let mut components = Vec::with_capacity(converter.components.len());
    let mut kept: Vec<usize> = (0..arrays.len()).filter(|&i| owner[i].is_none()).collect();
    for (c, rule) in converter.components.iter().enumerate() {
        let prefix = prefixes[c].as_str();
        let mine: Vec<usize> = (0..arrays.len()).filter(|&i| owner[i] == Some(c)).collect();
        if mine.is_empty() {
            return Err(format!("no key has the prefix {prefix:?} of {}", rule.name));
        }
        let keys: Vec<&str> = mine
            .iter()
            .map(|&i| &arrays[i].key[prefix.len()..])
            .collect();
        let vars = table
            .vars(&rule.keymap, &keys)
            .map_err(|why| format!("{}: {why}", rule.name))?;
        let mut tensors = Vec::with_capacity(mine.len());
        let mut unmapped = Vec::new();
        let mut taken: HashMap<String, usize> = HashMap::new();
        let sorted = Prefixes::new(keys.iter().copied());
        let present = |p: &str| sorted.has(p);
        for (&i, key) in mine.iter().zip(&keys) {
            match table.map(&rule.keymap, key, &vars, &present) {
                None => unmapped.push(arrays[i].key),
                Some(Mapped::Kept) => kept.push(i),
                Some(Mapped::Keys { with, .. }) if !with.is_empty() => {
                    return Err(format!(
                        "{}: a rule fuses arrays into {}",
                        rule.name, arrays[i].key
                    ));
                }
                Some(Mapped::Keys {
                    keys: targets,
                    op,
                    rows: weights,
                    ..
                }) => {
                    let source = arrays[i];
                    let shape = match (op, source.shape) {
                        (Op::Linear, [n, m, 1, 1] | [n, m]) => vec![*n, *m],
                        (Op::Linear, other) => {
                            return Err(format!(
                                "{} has shape {other:?}, which is no linear weight (nor a 1×1 \
                                 kernel)",
                                source.key
                            ))
                        }
                        (Op::Transpose, [n, m]) => vec![*m, *n],
                        (Op::Transpose, other) => {
                            return Err(format!(
                                "{} has shape {other:?}, which is not transposed (not 2-D)",
                                source.key
                            ))
                        }
                        (_, other) => other.to_vec(),
                    };
                    let parts = row_parts(source, op, targets.len(), &weights)?;
                    for (target, rows) in targets.into_iter().zip(parts) {
                        if let Some(other) = taken.insert(target.clone(), i) {
                            return Err(format!(
                                "{} and {} would both be {}'s {target:?}",
                                arrays[other].key, source.key, rule.name
                            ));
                        }
                        let shape = match rows.as_slice() {
                            [(begin, end)] => [&[end - begin][..], &shape[1..]].concat(),
                            _ => shape.clone(),
                        };
                        tensors.push(Renamed {
                            source: i,
                            key: target,
                            shape,
                            rows,
                            transposed: op == Op::Transpose,
                        });
                    }
                }
            }
        }
        let indexed: Vec<(String, i64)> = mine
            .iter()
            .flat_map(|&i| table.indexed(&rule.keymap, &arrays[i].key[prefix.len()..], &vars))
            .collect();
        if let Some(why) = gap(prefix, &indexed) {
            return Err(format!("{}: {why}", rule.name));
        }
        if !unmapped.is_empty() {
            let shown: Vec<&str> = unmapped.iter().take(3).copied().collect();
            let (count, have) = match unmapped.len() {
                1 => ("a key".to_owned(), "has"),
                n => (format!("{n} keys"), "have"),
            };
            return Err(format!(
                "{count} of {} {have} no rule ({}{})",
                rule.name,
                shown.join(", "),
                if unmapped.len() > 3 { ", …" } else { "" }
            ));
        }
        let mut identities = Vec::with_capacity(rule.identity.len());
        for (key, width_of) in &rule.identity {
            let Some(of) = tensors.iter().find(|t| t.key == *width_of) else {
                return Err(format!(
                    "{}: it has no {width_of}, whose width {key} has",
                    rule.name
                ));
            };
            if taken.contains_key(key) {
                return Err(format!(
                    "{}: the file holds {key}, which is made",
                    rule.name
                ));
            }
            let width = of.shape.first().copied().unwrap_or(0);
            identities.push(Renamed {
                source: of.source,
                key: key.clone(),
                shape: vec![width, width],
                rows: Vec::new(),
                transposed: false,
            });
        }
        components.push(Converted {
            rule,
            tensors,
            identities,
        });
    }
    kept.sort_unstable();
    Ok(Conversion {
        converter,
        components,
        kept,
        passed_over: Vec::new(),
    })
}

/// The row ranges of `source` each of `n` tensors is, in order (empty: the whole array): `n`
/// parts in proportions `weights` (empty: equal), or for a swap the array's second half of
/// rows, then its first.
fn row_parts(
    source: SourceKey<'_>,
    op: Op,
    n: usize,
    weights: &[u64],
) -> Result<Vec<Vec<(u64, u64)>>, String> {
    let rows = source.shape.first().copied();
    if op == Op::Swap {
        return match rows {
            Some(r) if r % 2 == 0 => Ok(vec![vec![(r / 2, r), (0, r / 2)]]),
            _ => Err(format!(
                "{} has shape {:?}, whose rows do not halve",
                source.key, source.shape
            )),
        };
    }
    if n == 1 {
        return Ok(vec![Vec::new()]);
    }
    let equal = vec![1; n];
    let (weights, parts) = match weights {
        [] => (&equal[..], format!("in {n}")),
        w => (
            w,
            w.iter().map(u64::to_string).collect::<Vec<_>>().join(":"),
        ),
    };
    let total: u64 = weights.iter().sum();
    let Some(unit) = rows.filter(|r| r % total == 0).map(|r| r / total) else {
        return Err(format!(
            "{} has shape {:?}, whose rows do not split {parts}",
            source.key, source.shape
        ));
    };
    let mut begin = 0;
    Ok(weights
        .iter()
        .map(|w| {
            let part = (begin, begin + w * unit);
            begin = part.1;
            vec![part]
        })
        .collect())
}

impl Table {
    /// Whether `key` lies under no component prefix of the table's checkpoints (a buffer such
    /// as `alphas_cumprod`, not a model's array).
    fn loose(&self, key: &str) -> bool {
        !self
            .converters
            .iter()
            .flat_map(|c| &c.components)
            .any(|r| !r.prefix.is_empty() && key.starts_with(r.prefix.as_str()))
    }

    /// The key, with its component's prefix, that `key` (a Diffusers key of a component of
    /// `rule`'s, whose keys are `keys`) has in the rule's single file, by the rule's reverse
    /// keymap, or else the reverse another rule of the same keymap has (a whole FLUX.1
    /// checkpoint's transformer is written as split files, yet named as its file names it);
    /// `None` without one, or when no rule takes the key to one key.
    pub(crate) fn file_key(
        &self,
        rule: &ComponentRule,
        keys: &[&str],
        key: &str,
    ) -> Option<String> {
        let reverse = rule.reverse.as_deref().or_else(|| {
            self.converters
                .iter()
                .flat_map(|c| &c.components)
                .filter(|r| r.keymap == rule.keymap)
                .find_map(|r| r.reverse.as_deref())
        })?;
        let vars = self.vars(reverse, keys).ok()?;
        let sorted = Prefixes::new(keys.iter().copied());
        let present = |p: &str| sorted.has(p);
        match self.map(reverse, key, &vars, &present)? {
            Mapped::Keys { keys, .. } if keys.len() == 1 => {
                Some(format!("{}{}", rule.prefix, keys[0]))
            }
            _ => None,
        }
    }
}

/// Keys sorted, for asking whether one starts with a text.
struct Prefixes<'a>(Vec<&'a str>);

impl<'a> Prefixes<'a> {
    fn new(keys: impl Iterator<Item = &'a str>) -> Prefixes<'a> {
        let mut keys: Vec<&str> = keys.collect();
        keys.sort_unstable();
        Prefixes(keys)
    }

    /// Whether a key starts with `prefix`.
    fn has(&self, prefix: &str) -> bool {
        let at = self.0.partition_point(|k| *k < prefix);
        self.0.get(at).is_some_and(|k| k.starts_with(prefix))
    }
}

/// One array of the single file a lane's components make ([`reverse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileArray {
    /// Its key in the file (with its component's prefix).
    pub key: String,
    /// Its shape in the file.
    pub shape: Vec<u64>,
    /// The component whose tensors it is.
    pub component: String,
    /// The tensors' rows that, one after another, are the array: one whole tensor for most;
    /// OpenCLIP's fused `in_proj_weight` is Diffusers' `q_proj`, `k_proj`, `v_proj`; an
    /// original adaLN projection is the second half of Diffusers' rows, then the first.
    pub pieces: Vec<TensorRows>,
    /// Whether the array is its one tensor transposed.
    pub transposed: bool,
}

/// A lane's components as one converter's single file.
#[derive(Debug)]
pub(crate) struct Reversed<'t> {
    /// The file's name in the single-file face: `model.safetensors` for a whole pipeline's,
    /// `<component>.safetensors` for a model alone's.
    pub name: String,
    /// The converter whose file it is.
    #[cfg_attr(not(test), allow(dead_code))] // what tests ask of a reversal
    pub converter: &'t Converter,
    /// The file's arrays, in no particular order.
    pub arrays: Vec<FileArray>,
}

/// The single files a lane's Diffusers components make: the one file of the converter whose
/// pipeline they are (its `single_when` config values told apart, SD 1.x's quick-GELU text
/// encoder from SD 2.x's GELU one); else, for a pipeline no converter writes whole (FLUX.1,
/// SD3 as ComfyUI loads them: diffusion model, VAE and text encoders from their own folders),
/// one file per weighted component, each the first model-alone converter's (in table order)
/// that takes a component of its name and class, when every one has one; for a model folder
/// (no pipeline), its model's file ([`reverse_model`]). Each file is each
/// component's tensors through its `reverse` keymap, under its prefix, and is checked by
/// converting it back: it must give exactly the components' tensors, so what loads the file
/// loads the lane.
///
/// # Errors
/// No converter (or several) makes such a file, a component has encoded tensors, a tensor
/// has no rule, or the file would not convert back to the components.
pub(crate) fn reverse<'t>(
    table: &'t Table,
    header: &crate::format::Header,
) -> Result<Vec<Reversed<'t>>, String> {
    use crate::format::Value;
    if super::LaneView::single_file_component(header).is_some() {
        return Err("it is a single-file checkpoint's lane, whose folder shows the file".into());
    }
    let Some(pipeline) = header.pipeline.as_ref() else {
        return reverse_model(table, header);
    };
    let class = pipeline.class.name.as_str();
    let weighted: BTreeSet<&str> = header
        .components
        .iter()
        .filter(|c| !c.tensors.is_empty())
        .map(|c| c.name.as_str())
        .collect();
    let value_is = |v: &Value, want: &serde_json::Value| match (v, want) {
        (Value::Text(t), serde_json::Value::String(w)) => t == w,
        (Value::Uint(n), serde_json::Value::Number(w)) => w.as_u64() == Some(*n),
        (Value::Bool(b), serde_json::Value::Bool(w)) => b == w,
        _ => false,
    };
    let fits = |c: &&Converter| {
        let names: BTreeSet<&str> = c.components.iter().map(|r| r.name.as_str()).collect();
        c.components.iter().all(|r| r.reverse.is_some())
            && c.pipelines().any(|p| p == class)
            && names == weighted
            && c.single_when.iter().all(|(component, keys)| {
                let config = header.components.iter().find(|x| x.name == *component);
                keys.iter().all(|(key, allowed)| {
                    let value = config.and_then(|x| x.config.get(key));
                    value.is_some_and(|v| allowed.iter().any(|w| value_is(v, w)))
                })
            })
    };
    let found: Vec<&Converter> = table.converters.iter().filter(fits).collect();
    let whole = |converter| {
        Ok(vec![Reversed {
            name: super::SINGLE_FILE_NAME.to_owned(),
            converter,
            arrays: reverse_by(table, converter, header)?,
        }])
    };
    match found.as_slice() {
        [one] => whole(one),
        [] => reverse_alone(table, header).map_err(|why| {
            format!(
                "no converter makes a single file of a {class} of {} ({why})",
                weighted.iter().copied().collect::<Vec<_>>().join(", ")
            )
        }),
        many => {
            let names: Vec<&str> = many.iter().map(|c| c.name.as_str()).collect();
            Err(format!(
                "several converters make one ({})",
                names.join(", ")
            ))
        }
    }
}

/// The single file of a model folder (no pipeline; its one weighted component is
/// [`super::ROOT_COMPONENT`]): its tensors in the layout of the first model-alone converter
/// (in table order) that takes its class, as ComfyUI loads a diffusion model, VAE or text
/// encoder alone (a VAE repo's `diffusion_pytorch_model.safetensors` as the file ComfyUI's
/// `vae/` holds). The file is [`super::SINGLE_FILE_NAME`].
///
/// # Errors
/// Another component layout, no converter of its class, or why each that was tried could not.
fn reverse_model<'t>(
    table: &'t Table,
    header: &crate::format::Header,
) -> Result<Vec<Reversed<'t>>, String> {
    use super::ROOT_COMPONENT;
    let weighted: Vec<_> = header
        .components
        .iter()
        .filter(|c| !c.tensors.is_empty())
        .collect();
    let [model] = weighted.as_slice() else {
        return Err("it has no pipeline, and not one model".into());
    };
    if model.name != ROOT_COMPONENT {
        return Err(format!(
            "it has no pipeline, and its model is {:?}",
            model.name
        ));
    }
    let takes = |conv: &&'t Converter| {
        conv.pipeline.is_none()
            && matches!(conv.components.as_slice(), [r] if r.reverse.is_some()
                && r.class.1 == model.class.name)
    };
    let mut tried = Vec::new();
    for converter in table.converters.iter().filter(takes) {
        // The converter's rule names the component as a pipeline does (`vae`, `transformer`).
        let rule = &converter.components[0];
        let mut named = header.clone();
        for c in named
            .components
            .iter_mut()
            .filter(|c| c.name == ROOT_COMPONENT)
        {
            c.name = rule.name.clone();
        }
        match reverse_by(table, converter, &named) {
            Ok(mut arrays) => {
                for a in &mut arrays {
                    a.component = ROOT_COMPONENT.to_owned();
                }
                return Ok(vec![Reversed {
                    name: super::SINGLE_FILE_NAME.to_owned(),
                    converter,
                    arrays,
                }]);
            }
            Err(why) => tried.push(format!("{}: {why}", converter.name)),
        }
    }
    Err(match tried.is_empty() {
        true => format!(
            "no converter writes a {} alone back to a single file",
            model.class.name
        ),
        false => tried.join("; "),
    })
}

/// One file per weighted component of `header`, each by the first model-alone converter that
/// takes it ([`reverse`]).
///
/// # Errors
/// A weighted component no such converter takes (why each that was tried could not).
fn reverse_alone<'t>(
    table: &'t Table,
    header: &crate::format::Header,
) -> Result<Vec<Reversed<'t>>, String> {
    let mut files = Vec::new();
    for c in header.components.iter().filter(|c| !c.tensors.is_empty()) {
        let takes = |conv: &&'t Converter| {
            conv.pipeline.is_none()
                && matches!(conv.components.as_slice(), [r] if r.reverse.is_some()
                    && r.name == c.name && r.class.1 == c.class.name)
        };
        let mut tried = Vec::new();
        let found = table.converters.iter().filter(takes).find_map(|conv| {
            match reverse_by(table, conv, header) {
                Ok(arrays) => Some(Reversed {
                    name: format!("{}.safetensors", c.name),
                    converter: conv,
                    arrays,
                }),
                Err(why) => {
                    tried.push(format!("{}: {why}", conv.name));
                    None
                }
            }
        });
        match found {
            Some(file) => files.push(file),
            None if tried.is_empty() => {
                return Err(format!(
                    "no converter writes a {} alone back to a single file",
                    c.class.name
                ))
            }
            None => return Err(tried.join("; ")),
        }
    }
    Ok(files)
}

/// `header`'s components of `converter` as its single file's arrays, checked by converting
/// them back ([`reverse`]).
///
/// # Errors
/// A component has encoded tensors, a tensor has no rule, or the file would not convert back.
fn reverse_by(
    table: &Table,
    converter: &Converter,
    header: &crate::format::Header,
) -> Result<Vec<FileArray>, String> {
    use crate::format::Body;
    let mut arrays = Vec::new();
    for rule in &converter.components {
        let keymap = rule.reverse.as_deref().expect("checked above");
        let component = header
            .components
            .iter()
            .find(|c| c.name == rule.name)
            .expect("checked above");
        let mut shapes: HashMap<&str, (&crate::format::Dtype, &[u64])> = HashMap::new();
        for t in &component.tensors {
            match &t.body {
                Body::Plain(_) => shapes.insert(&t.key, (&t.dtype, &t.shape)),
                Body::Encoded { .. } => {
                    return Err(format!("{}: {} is encoded", rule.name, t.key));
                }
            };
        }
        let keys: Vec<&str> = component.tensors.iter().map(|t| t.key.as_str()).collect();
        let vars = table
            .vars(keymap, &keys)
            .map_err(|why| format!("{}: {why}", rule.name))?;
        let sorted = Prefixes::new(keys.iter().copied());
        let present = |p: &str| sorted.has(p);
        // The keys another key's rule fuses with it (the rule takes the first of them, in
        // whichever order the component lists them).
        let fused: BTreeSet<String> = keys
            .iter()
            .filter_map(|key| match table.map(keymap, key, &vars, &present) {
                Some(Mapped::Keys { with, .. }) => Some(with),
                _ => None,
            })
            .flatten()
            .collect();
        for key in &keys {
            if fused.contains(*key) {
                continue;
            }
            let (dtype, shape) = shapes[key];
            let (target, op, with) = match table.map(keymap, key, &vars, &present) {
                None => return Err(format!("{}: no rule takes {key}", rule.name)),
                Some(Mapped::Kept) => continue,
                Some(Mapped::Keys {
                    mut keys, op, with, ..
                }) if keys.len() == 1 => (keys.remove(0), op, with),
                Some(Mapped::Keys { .. }) => {
                    return Err(format!("{}: a reverse rule splits {key}", rule.name))
                }
            };
            let mut rows = shape.first().copied().unwrap_or(0);
            for other in &with {
                match shapes.get(other.as_str()) {
                    Some((d, s)) if *d == dtype && s.get(1..) == shape.get(1..) => rows += s[0],
                    _ => {
                        return Err(format!(
                            "{}: {key} is fused with {other}, which it has not, or not of its \
                             dtype and width",
                            rule.name
                        ))
                    }
                }
            }
            let shape = match (op, shape) {
                (Op::Same, s) if with.is_empty() => s.to_vec(),
                (Op::Same, [_, rest @ ..]) => [&[rows][..], rest].concat(),
                (Op::Transpose, [n, m]) => vec![*m, *n],
                (Op::Kernel, [n, m]) => vec![*n, *m, 1, 1],
                (Op::Swap, s @ [r, ..]) if with.is_empty() && r % 2 == 0 => s.to_vec(),
                (op, s) => {
                    return Err(format!(
                        "{}: {key} of shape {s:?} takes no {op:?}",
                        rule.name
                    ))
                }
            };
            let pieces = match op {
                Op::Swap => {
                    let half = rows / 2;
                    [(half, rows), (0, half)]
                        .map(|range| TensorRows::part(*key, range))
                        .to_vec()
                }
                _ => std::iter::once(key.to_string())
                    .chain(with)
                    .map(TensorRows::whole)
                    .collect(),
            };
            arrays.push(FileArray {
                key: format!("{}{target}", rule.prefix),
                shape,
                component: rule.name.clone(),
                pieces,
                transposed: op == Op::Transpose,
            });
        }
    }
    check_round_trip(table, converter, header, &arrays)?;
    Ok(arrays)
}

/// That `arrays`, converted by `converter`, give back the header's components' tensors: each
/// array's row ranges the tensors its pieces say (transposed or not, with their shapes), under
/// their own keys or keys the component's reverse keymap takes to the same array
/// (Transformers' two names of a CLIP text model's parameters, with and without
/// `text_model.`), and no array left in the file's own component.
fn check_round_trip(
    table: &Table,
    converter: &Converter,
    header: &crate::format::Header,
    arrays: &[FileArray],
) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    if let Some(a) = arrays.iter().find(|a| !seen.insert(a.key.as_str())) {
        return Err(format!("two tensors would both be {}", a.key));
    }
    let keys: Vec<SourceKey<'_>> = arrays
        .iter()
        .map(|a| SourceKey {
            key: &a.key,
            shape: &a.shape,
        })
        .collect();
    let back = convert(table, converter, &keys)
        .map_err(|why| format!("it would not convert back: {why}"))?;
    if let Some(&i) = back.kept.first() {
        return Err(format!(
            "{} would stay in the file's own component",
            arrays[i].key
        ));
    }
    // Each array's rows as the conversion takes them: (array rows, tensor, tensor rows).
    let mut taken: Vec<Vec<Span>> = vec![Vec::new(); arrays.len()];
    for converted in &back.components {
        let rule = converted.rule;
        let component = header
            .components
            .iter()
            .find(|c| c.name == rule.name)
            .ok_or_else(|| format!("no component {}", rule.name))?;
        let shapes: HashMap<&str, &[u64]> = component
            .tensors
            .iter()
            .map(|t| (t.key.as_str(), t.shape.as_slice()))
            .collect();
        let keys: Vec<&str> = component.tensors.iter().map(|t| t.key.as_str()).collect();
        let reverse = rule.reverse.as_deref().expect("a reversed component");
        let vars = table.vars(reverse, &keys)?;
        let sorted = Prefixes::new(keys.iter().copied());
        let present = |p: &str| sorted.has(p);
        // The file key that `key`, a name of the component's, is written as.
        let written = |key: &str| match table.map(reverse, key, &vars, &present) {
            Some(Mapped::Keys { keys, .. }) => keys.first().map(|k| format!("{}{k}", rule.prefix)),
            _ => None,
        };
        for r in &converted.tensors {
            let array = &arrays[r.source];
            // A tensor the array holds under another of its names is that name's.
            let key = match array.pieces.as_slice() {
                [one] if one.tensor != r.key && written(&r.key).as_deref() == Some(&array.key) => {
                    one.tensor.as_str()
                }
                _ => r.key.as_str(),
            };
            let same = array.component == rule.name
                && shapes.get(key) == Some(&r.shape.as_slice())
                && array.transposed == r.transposed;
            if !same {
                return Err(format!(
                    "{} would convert back to {}'s {} otherwise",
                    array.key, rule.name, r.key
                ));
            }
            let whole = [(0, rows_of(&array.shape))];
            let ranges = if r.rows.is_empty() {
                &whole[..]
            } else {
                &r.rows
            };
            let mut at = 0;
            for &(begin, end) in ranges {
                taken[r.source].push((begin, end, key.to_owned(), at));
                at += end - begin;
            }
        }
    }
    for (a, mut taken) in arrays.iter().zip(taken) {
        let mut pieces = Vec::with_capacity(a.pieces.len());
        let mut at = 0;
        for p in &a.pieces {
            let tensor_rows = header
                .component(&a.component)
                .and_then(|c| c.tensors.iter().find(|t| t.key == p.tensor))
                .map(|t| rows_of(&t.shape));
            let (begin, end) = match a.transposed {
                true => (0, rows_of(&a.shape)),
                false => p.rows.or(tensor_rows.map(|r| (0, r))).unwrap_or((0, 0)),
            };
            pieces.push((at, at + end - begin, p.tensor.clone(), begin));
            at += end - begin;
        }
        taken.sort();
        if merged(taken) != merged(pieces) {
            return Err(format!("{} would not convert back to its tensors", a.key));
        }
    }
    Ok(())
}

/// Rows of an array: `[begin, end)` in the array, the tensor, and where in the tensor's rows
/// they begin.
type Span = (u64, u64, String, u64);

/// `spans`, in array order, with runs that continue one another in array and tensor joined.
fn merged(spans: Vec<Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(last) if last.1 == s.0 && last.2 == s.2 && last.3 + (last.1 - last.0) == s.3 => {
                last.1 = s.1;
            }
            _ => out.push(s),
        }
    }
    out
}

/// Rows of a tensor of `shape`: its first extent (1 for a scalar).
fn rows_of(shape: &[u64]) -> u64 {
    shape.first().copied().unwrap_or(1)
}

#[cfg(test)]
mod tests;
