//! `cozytensors.tree/1` (spec §3): a commit, one header and its repository files.

use std::collections::BTreeMap;

use super::json::{self, Json};
use super::{names, FormatError, FormatResult, ObjectRef};

/// The `format` tag a writer writes.
pub const TREE_FORMAT: &str = "cozytensors.tree/1";

/// The folder of a plain tree's chunks (spec §3), which no file path may start with.
const CHUNKS_DIR: &str = "chunks";

/// A validated tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// The lane label (`bf16`, `fp16`), if any.
    pub lane: Option<String>,
    /// Every file by path: exactly one ends in `.cozytensors` (the header), the rest are repo
    /// files. No path's first segment is `chunks`.
    pub files: BTreeMap<String, ObjectRef>,
}

impl Tree {
    /// Parses and validates a tree; unknown fields are ignored.
    ///
    /// An empty `lane` reads as no lane: it is the field's default (spec §9), which a writer
    /// omits and the reference implementation reads the same way.
    ///
    /// # Errors
    /// Strict-JSON errors, another kind or major, a bad lane, a path that is not a path or
    /// starts with `chunks`, not exactly one `.cozytensors` file.
    pub fn from_json(bytes: &[u8]) -> FormatResult<Tree> {
        let fields = json::read_document(bytes, TREE_FORMAT)?;
        let lane = match json::field(&fields, "lane") {
            None => None,
            Some(Json::Text(lane)) if lane.is_empty() => None,
            Some(Json::Text(lane)) if names::is_label(lane) => Some(lane.clone()),
            Some(Json::Text(lane)) => {
                return Err(FormatError::Invalid(format!(
                    "lane {lane:?} is not a label: alphanumeric first, then at most 63 of \
                     A-Za-z0-9._+!- (spec §3)"
                )))
            }
            Some(other) => return Err(json::wrong_type("$.lane", "a string", other)),
        };
        let entries = json::required_object(&fields, "files", "$")?;
        let mut files = BTreeMap::new();
        let mut headers = Vec::new();
        for (path, object) in entries {
            let at = format!("$.files{}", json::key_segment(path));
            if !names::is_path(path) {
                return Err(FormatError::Invalid(format!(
                    "file {path:?} is not a path of segments (spec §2)"
                )));
            }
            if path.split('/').next() == Some(CHUNKS_DIR) {
                return Err(FormatError::Invalid(format!(
                    "file {path:?} is under `{CHUNKS_DIR}/`, a plain folder's chunk directory \
                     (spec §3)"
                )));
            }
            if path.ends_with(".cozytensors") {
                headers.push(path.as_str());
            }
            files.insert(path.clone(), json::object_ref(object, &at)?);
        }
        match headers[..] {
            [_] => {}
            [] => {
                return Err(FormatError::Invalid(
                    "the tree has no .cozytensors file; a commit holds one header (spec §3)".into(),
                ))
            }
            _ => {
                return Err(FormatError::Invalid(format!(
                    "the tree has {} .cozytensors files {headers:?}; a commit holds one header \
                     (spec §3)",
                    headers.len()
                )))
            }
        }
        Ok(Tree { lane, files })
    }

    /// The canonical JSON bytes (spec §9), `lane` omitted when `None`.
    pub fn to_json(&self) -> Vec<u8> {
        let files = self
            .files
            .iter()
            .map(|(path, object)| (path.clone(), json::object_ref_json(object)))
            .collect();
        let mut fields = vec![
            ("files".to_string(), Json::Object(files)),
            ("format".to_string(), Json::Text(TREE_FORMAT.into())),
        ];
        // An empty lane is the default, which the canonical form omits (spec §9).
        if let Some(lane) = self.lane.as_ref().filter(|lane| !lane.is_empty()) {
            fields.push(("lane".to_string(), Json::Text(lane.clone())));
        }
        json::canonical(&Json::Object(fields))
            .expect("a tree holds no float or null, and its keys are unique")
            .into_bytes()
    }

    /// The header's path and object.
    pub fn header(&self) -> (&str, &ObjectRef) {
        self.files
            .iter()
            .find(|(path, _)| path.ends_with(".cozytensors"))
            .map(|(p, o)| (p.as_str(), o))
            .expect("a validated tree has one header")
    }

    /// The repo files: every file but the header.
    pub fn repo_files(&self) -> impl Iterator<Item = (&str, &ObjectRef)> {
        self.files
            .iter()
            .filter(|(path, _)| !path.ends_with(".cozytensors"))
            .map(|(p, o)| (p.as_str(), o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASIC: &[u8] = include_bytes!("../../tests/data/tree/tree-basic.json");
    const SHA: &str = "adc37366f403835c1470ab2df93d3837d4719372fc1ef8593d922e06f033f8b2";

    fn tree_with(extra: &str, files: &str) -> String {
        format!(r#"{{"format":"cozytensors.tree/1"{extra},"files":{{{files}}}}}"#)
    }

    fn file(path: &str) -> String {
        format!(r#""{path}":{{"sha256":"{SHA}","length":4}}"#)
    }

    fn invalid(text: &str) -> String {
        match Tree::from_json(text.as_bytes()) {
            Err(e) => e.to_string(),
            Ok(tree) => panic!("{text} should be refused, got {tree:?}"),
        }
    }

    #[test]
    fn the_spec_example_round_trips_byte_for_byte() {
        let tree = Tree::from_json(BASIC).unwrap();
        assert_eq!(tree.lane.as_deref(), Some("int8"));
        assert_eq!(tree.files.len(), 3);
        let (path, header) = tree.header();
        assert_eq!(path, "model.cozytensors");
        assert_eq!(header.length, 610);
        let repo_files: Vec<&str> = tree.repo_files().map(|(p, _)| p).collect();
        assert_eq!(repo_files, ["LICENSE", "README.md"]);
        assert_eq!(tree.to_json(), BASIC);
    }

    #[test]
    fn unknown_fields_are_ignored_at_every_level_and_minors_accepted() {
        let text = format!(
            r#"{{"format":"cozytensors.tree/1.7","x":{{"y":[1,-2,"z",true]}},"files":{{"a/m.cozytensors":{{"sha256":"{SHA}","length":4,"extra":"x"}}}}}}"#
        );
        let tree = Tree::from_json(text.as_bytes()).unwrap();
        assert_eq!(tree.lane, None);
        // The writer's form drops what it does not know and writes the major it speaks.
        assert_eq!(
            String::from_utf8(tree.to_json()).unwrap(),
            format!(
                r#"{{"files":{{"a/m.cozytensors":{{"length":4,"sha256":"{SHA}"}}}},"format":"cozytensors.tree/1"}}"#
            )
        );
    }

    #[test]
    fn an_empty_lane_is_no_lane() {
        let tree =
            Tree::from_json(tree_with(r#","lane":"""#, &file("m.cozytensors")).as_bytes()).unwrap();
        assert_eq!(tree.lane, None);
        assert!(!String::from_utf8(tree.to_json()).unwrap().contains("lane"));
    }

    #[test]
    fn formats_of_other_kinds_and_majors_are_refused() {
        for tag in [
            "cozytensors.tree/2",
            "cozytensors.tree/10",
            "cozytensors.tree/1.",
            "cozytensors.tree/1.x",
            "cozytensors.tree/1.0\n",
            "cozytensors.repo/1",
            "cozytensors/1",
        ] {
            let text = format!(r#"{{"format":{tag:?},"files":{{}}}}"#);
            assert!(
                matches!(
                    Tree::from_json(text.as_bytes()),
                    Err(FormatError::Format { .. })
                ),
                "{tag}"
            );
        }
        assert!(invalid(r#"{"files":{}}"#).contains("no `format`"));
        assert!(invalid(r#"{"format":1,"files":{}}"#).contains("not a string"));
        assert!(invalid("[]").contains("JSON object"));
    }

    #[test]
    fn values_a_document_cannot_hold_are_refused_even_in_unknown_fields() {
        let header = file("m.cozytensors");
        assert!(invalid(&tree_with(r#","x":null"#, &header)).contains("$.x is null"));
        assert!(invalid(&tree_with(r#","x":[1.0]"#, &header)).contains("fraction"));
        assert!(invalid(&tree_with(r#","x":1,"x":2"#, &header)).contains("repeated key"));
        let float_len = format!(r#""m.cozytensors":{{"sha256":"{SHA}","length":4.0}}"#);
        assert!(invalid(&tree_with("", &float_len)).contains("fraction"));
    }

    #[test]
    fn fields_of_the_wrong_type_or_value_are_refused() {
        let header = file("m.cozytensors");
        assert!(invalid(&tree_with(r#","lane":5"#, &header)).contains("$.lane"));
        assert!(invalid(&tree_with(r#","lane":"-x""#, &header)).contains("not a label"));
        assert!(invalid(r#"{"format":"cozytensors.tree/1","files":[]}"#).contains("not an object"));
        assert!(invalid(r#"{"format":"cozytensors.tree/1"}"#).contains("no `files`"));
        let neg = format!(r#""m.cozytensors":{{"sha256":"{SHA}","length":-1}}"#);
        assert!(invalid(&tree_with("", &neg)).contains("length"));
        let upper = format!(
            r#""m.cozytensors":{{"sha256":"{}","length":1}}"#,
            SHA.to_uppercase()
        );
        assert!(invalid(&tree_with("", &upper)).contains("sha256"));
        assert!(invalid(&tree_with("", r#""m.cozytensors":{"length":1}"#)).contains("no `sha256`"));
        let no_len = format!(r#""m.cozytensors":{{"sha256":"{SHA}"}}"#);
        assert!(invalid(&tree_with("", &no_len)).contains("no `length`"));
        assert!(invalid(&tree_with("", r#""m.cozytensors":"x""#)).contains("object ref"));
    }

    #[test]
    fn paths_and_the_single_header_are_checked() {
        let header = file("m.cozytensors");
        for bad in [
            "chunks/x", "chunks", "a//b", "/a", "a/", "./a", "a/../b", "a\\\\b",
        ] {
            let text = tree_with("", &format!("{header},{}", file(bad)));
            invalid(&text);
        }
        // `chunks` is refused only as the first segment.
        let ok = tree_with(
            "",
            &format!("{header},{},{}", file("a/chunks"), file("chunksx")),
        );
        assert!(Tree::from_json(ok.as_bytes()).is_ok());
        assert!(invalid(&tree_with("", &file("README.md"))).contains("no .cozytensors"));
        let two = tree_with("", &format!("{header},{}", file("b/m.cozytensors")));
        assert!(invalid(&two).contains("2 .cozytensors"));
    }

    #[test]
    fn to_json_then_from_json_is_identity() {
        let tree = Tree::from_json(BASIC).unwrap();
        let mut other = tree.clone();
        other.lane = None;
        other
            .files
            .insert("sub dir/é \"q\".json".into(), *tree.header().1);
        let bytes = other.to_json();
        assert_eq!(Tree::from_json(&bytes).unwrap(), other);
    }
}
