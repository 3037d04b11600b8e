//! `cozytensors.repo/1` (spec §7): a model's releases and other commits.

use std::collections::BTreeMap;

use super::json::{self, Json};
use super::{names, FormatError, FormatResult, ObjectRef};

/// The `format` tag a writer writes.
pub const REPO_FORMAT: &str = "cozytensors.repo/1";

/// A validated repo document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repo {
    /// `<org>/<name>` in the writer's spelling.
    pub name: String,
    /// Releases, oldest first.
    pub releases: Vec<Release>,
    /// Commits no release names, newest last.
    pub commits: Vec<ObjectRef>,
}

/// A release: one commit per lane under a version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The version label (a PEP 440 version).
    pub version: String,
    /// The commit of each lane.
    pub lanes: BTreeMap<String, ObjectRef>,
}

fn not_a_label(what: &str, text: &str) -> FormatError {
    FormatError::Invalid(format!(
        "{what} {text:?} is not a label: alphanumeric first, then at most 63 of A-Za-z0-9._+!- \
         (spec §3, §7)"
    ))
}

/// The elements of optional array field `key` (absent: none).
fn optional_array<'a>(fields: &'a [(String, Json)], key: &str) -> FormatResult<&'a [Json]> {
    match json::field(fields, key) {
        None => Ok(&[]),
        Some(Json::Array(items)) => Ok(items),
        Some(other) => Err(json::wrong_type(&format!("$.{key}"), "an array", other)),
    }
}

fn release_from_json(json: &Json, at: &str) -> FormatResult<Release> {
    let Json::Object(fields) = json else {
        return Err(json::wrong_type(at, "an object {version, lanes}", json));
    };
    let version = json::required_text(fields, "version", at)?;
    if !names::is_label(version) {
        return Err(not_a_label("release version", version));
    }
    let mut lanes = BTreeMap::new();
    for (lane, commit) in json::required_object(fields, "lanes", at)? {
        if !names::is_label(lane) {
            return Err(not_a_label(&format!("release {version:?} lane"), lane));
        }
        let lane_at = format!("{at}.lanes{}", json::key_segment(lane));
        lanes.insert(lane.clone(), json::object_ref(commit, &lane_at)?);
    }
    Ok(Release {
        version: version.to_string(),
        lanes,
    })
}

impl Repo {
    /// Parses and validates a repo document; unknown fields are ignored.
    ///
    /// Release versions are checked as labels only; their PEP 440 order is the writer's duty
    /// and the resolver's concern, not a reason to refuse the document.
    ///
    /// # Errors
    /// Strict-JSON errors, another kind or major, a name that is not `org/name`, a label that is
    /// not a label.
    pub fn from_json(bytes: &[u8]) -> FormatResult<Repo> {
        let fields = json::read_document(bytes, REPO_FORMAT)?;
        let name = json::required_text(&fields, "name", "$")?;
        names::split_repo_name(name)?;
        let releases = optional_array(&fields, "releases")?
            .iter()
            .enumerate()
            .map(|(i, release)| release_from_json(release, &format!("$.releases[{i}]")))
            .collect::<FormatResult<Vec<_>>>()?;
        let commits = optional_array(&fields, "commits")?
            .iter()
            .enumerate()
            .map(|(i, commit)| json::object_ref(commit, &format!("$.commits[{i}]")))
            .collect::<FormatResult<Vec<_>>>()?;
        Ok(Repo {
            name: name.to_string(),
            releases,
            commits,
        })
    }

    /// The canonical JSON bytes; empty `releases` and `commits` omitted.
    pub fn to_json(&self) -> Vec<u8> {
        let mut fields = vec![
            ("format".to_string(), Json::Text(REPO_FORMAT.into())),
            ("name".to_string(), Json::Text(self.name.clone())),
        ];
        if !self.releases.is_empty() {
            let releases = self
                .releases
                .iter()
                .map(|release| {
                    let lanes = release
                        .lanes
                        .iter()
                        .map(|(lane, commit)| (lane.clone(), json::object_ref_json(commit)))
                        .collect();
                    Json::Object(vec![
                        ("lanes".to_string(), Json::Object(lanes)),
                        ("version".to_string(), Json::Text(release.version.clone())),
                    ])
                })
                .collect();
            fields.push(("releases".to_string(), Json::Array(releases)));
        }
        if !self.commits.is_empty() {
            let commits = self.commits.iter().map(json::object_ref_json).collect();
            fields.push(("commits".to_string(), Json::Array(commits)));
        }
        json::canonical(&Json::Object(fields))
            .expect("a repo holds no float or null, and its keys are unique")
            .into_bytes()
    }

    /// Records `commit` as lane `lane` of release `version`. A new release goes before the
    /// first later version ([`version_order`]), so `releases` stays oldest first; a commit
    /// `commits` listed is dropped from there, as a release names it now.
    pub fn set_lane(&mut self, version: &str, lane: &str, commit: ObjectRef) {
        self.commits.retain(|c| *c != commit);
        if let Some(release) = self.releases.iter_mut().find(|r| r.version == version) {
            release.lanes.insert(lane.to_string(), commit);
            return;
        }
        let order = version_order(version);
        let at = self
            .releases
            .iter()
            .position(|r| version_order(&r.version) > order)
            .unwrap_or(self.releases.len());
        self.releases.insert(
            at,
            Release {
                version: version.to_string(),
                lanes: BTreeMap::from([(lane.to_string(), commit)]),
            },
        );
    }

    /// Records `commit` as the newest of `commits`, unless a release or `commits` names it
    /// already. True when it was added.
    pub fn add_commit(&mut self, commit: ObjectRef) -> bool {
        if self.roots().any(|c| *c == commit) {
            return false;
        }
        self.commits.push(commit);
        true
    }

    /// Every commit the repo names: each release's lanes, then the other commits.
    pub fn roots(&self) -> impl Iterator<Item = &ObjectRef> {
        self.releases
            .iter()
            .flat_map(|r| r.lanes.values())
            .chain(self.commits.iter())
    }
}

/// The order of release versions: the numbers of a PEP 440 release segment (`1.10.2` is
/// `[1, 10, 2]`, trailing zeros dropped so `1.0` equals `1`), after an optional epoch `N!`
/// and `v`. Pre-, post- and dev-release suffixes are not compared; a version without leading
/// digits orders first.
pub fn version_order(version: &str) -> (u64, Vec<u64>) {
    let text = version.trim_start_matches(['v', 'V']);
    let (epoch, text) = match text.split_once('!') {
        Some((epoch, rest)) => (epoch.parse().unwrap_or(0), rest),
        None => (0, text),
    };
    let mut release = Vec::new();
    for part in text.split('.') {
        let digits = part.bytes().take_while(u8::is_ascii_digit).count();
        match part[..digits].parse::<u64>() {
            Ok(n) => release.push(n),
            Err(_) => break,
        }
        if digits < part.len() {
            break;
        }
    }
    while release.last() == Some(&0) {
        release.pop();
    }
    (epoch, release)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASIC: &[u8] = include_bytes!("../../tests/data/repo/repo-basic.json");
    /// A repo document as the reference implementation (0.17.2) wrote it, with an empty
    /// `releases` it does not omit.
    const REFERENCE_LOCAL: &[u8] =
        include_bytes!("../../tests/data/repo/repo-reference-local.json");
    const SHA: &str = "e5050878495f006707c4bd570606888de0541ae66f33c8198c1ef46c9d71de2f";

    fn invalid(text: &str) -> String {
        match Repo::from_json(text.as_bytes()) {
            Err(e) => e.to_string(),
            Ok(repo) => panic!("{text} should be refused, got {repo:?}"),
        }
    }

    #[test]
    fn the_spec_example_round_trips_byte_for_byte() {
        let repo = Repo::from_json(BASIC).unwrap();
        assert_eq!(repo.name, "acme/tiny");
        assert_eq!(repo.releases.len(), 1);
        assert_eq!(repo.releases[0].version, "1.0");
        assert_eq!(repo.releases[0].lanes["int8"].length, 366);
        assert!(repo.commits.is_empty());
        assert_eq!(repo.roots().count(), 1);
        assert_eq!(repo.to_json(), BASIC);
    }

    #[test]
    fn a_reference_written_repo_reads_and_rewrites_canonically() {
        let repo = Repo::from_json(REFERENCE_LOCAL).unwrap();
        assert_eq!(repo.name, "local/minilm");
        assert!(repo.releases.is_empty());
        assert_eq!(repo.commits.len(), 1);
        assert_eq!(repo.commits[0].length, 495);
        assert_eq!(
            String::from_utf8(repo.to_json()).unwrap(),
            r#"{"commits":[{"length":495,"sha256":"6ac6b2c8f2f16f7780cae7dcf6bfd571277b8ef3694dec0be857493f8211211b"}],"format":"cozytensors.repo/1","name":"local/minilm"}"#
        );
    }

    #[test]
    fn unknown_fields_are_ignored_and_minors_accepted() {
        let text = format!(
            r#"{{"format":"cozytensors.repo/1.2","name":"Acme/SDXL","owner":{{"id":7}},"releases":[{{"version":"2.0rc1","lanes":{{"fp8":{{"sha256":"{SHA}","length":1,"x":[]}}}},"notes":"n"}}],"commits":[]}}"#
        );
        let repo = Repo::from_json(text.as_bytes()).unwrap();
        assert_eq!(repo.name, "Acme/SDXL");
        assert_eq!(repo.releases[0].version, "2.0rc1");
        assert_eq!(Repo::from_json(&repo.to_json()).unwrap(), repo);
    }

    #[test]
    fn refusals_name_the_rule() {
        let ok_lanes = format!(r#"{{"int8":{{"sha256":"{SHA}","length":1}}}}"#);
        for (text, says) in [
            (
                r#"{"format":"cozytensors.repo/1"}"#.to_string(),
                "no `name`",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":"acme"}"#.into(),
                "<org>/<name>",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":"a/b/c"}"#.into(),
                "<org>/<name>",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":"../b"}"#.into(),
                "<org>/<name>",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":7}"#.into(),
                "not a string",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":"a/b","releases":{}}"#.into(),
                "$.releases",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":"a/b","commits":[{}]}"#.into(),
                "$.commits[0]",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":"a/b","commits":null}"#.into(),
                "null",
            ),
            (
                format!(
                    r#"{{"format":"cozytensors.repo/1","name":"a/b","releases":[{{"version":"_1","lanes":{ok_lanes}}}]}}"#
                ),
                "release version",
            ),
            (
                format!(
                    r#"{{"format":"cozytensors.repo/1","name":"a/b","releases":[{{"version":"1","lanes":{{"non ema":{{"sha256":"{SHA}","length":1}}}}}}]}}"#
                ),
                "lane \"non ema\"",
            ),
            (
                r#"{"format":"cozytensors.repo/1","name":"a/b","releases":[{"version":"1"}]}"#
                    .into(),
                "no `lanes`",
            ),
            (
                format!(
                    r#"{{"format":"cozytensors.repo/1","name":"a/b","releases":[{{"lanes":{ok_lanes}}}]}}"#
                ),
                "no `version`",
            ),
        ] {
            let m = invalid(&text);
            assert!(m.contains(says), "{text}: {m}");
        }
        assert!(matches!(
            Repo::from_json(br#"{"format":"cozytensors.tree/1","name":"a/b"}"#),
            Err(FormatError::Format { .. })
        ));
    }

    #[test]
    fn empty_lists_are_omitted_and_order_is_kept() {
        let commit = |n: u64| ObjectRef {
            sha256: SHA.parse().unwrap(),
            length: n,
        };
        let repo = Repo {
            name: "acme/x".into(),
            releases: vec![
                Release {
                    version: "1.0".into(),
                    lanes: BTreeMap::from([("fp8".into(), commit(1)), ("bf16".into(), commit(2))]),
                },
                Release {
                    version: "0.9".into(),
                    lanes: BTreeMap::new(),
                },
            ],
            commits: vec![commit(9), commit(3)],
        };
        let back = Repo::from_json(&repo.to_json()).unwrap();
        assert_eq!(back, repo);
        let roots: Vec<u64> = back.roots().map(|c| c.length).collect();
        assert_eq!(roots, [2, 1, 9, 3]);
        let bare = Repo {
            name: "acme/x".into(),
            releases: vec![],
            commits: vec![],
        };
        assert_eq!(
            bare.to_json(),
            br#"{"format":"cozytensors.repo/1","name":"acme/x"}"#
        );
    }

    #[test]
    fn releases_are_inserted_in_version_order_and_commits_once() {
        let commit = |n: u64| ObjectRef {
            sha256: SHA.parse().unwrap(),
            length: n,
        };
        let mut repo = Repo {
            name: "acme/x".into(),
            releases: vec![],
            commits: vec![commit(7)],
        };
        repo.set_lane("1.10", "bf16", commit(1));
        repo.set_lane("1.2", "bf16", commit(2));
        repo.set_lane("2.0rc1", "fp8", commit(3));
        repo.set_lane("1.2", "fp8", commit(7));
        let versions: Vec<&str> = repo.releases.iter().map(|r| r.version.as_str()).collect();
        assert_eq!(versions, ["1.2", "1.10", "2.0rc1"]);
        assert_eq!(repo.releases[0].lanes.len(), 2);
        assert!(
            repo.commits.is_empty(),
            "a released commit leaves `commits`"
        );
        assert!(!repo.add_commit(commit(1)));
        assert!(repo.add_commit(commit(9)));
        assert!(!repo.add_commit(commit(9)));
        assert_eq!(repo.commits, [commit(9)]);
    }

    #[test]
    fn version_order_compares_release_numbers() {
        assert!(version_order("1.9") < version_order("1.10"));
        assert_eq!(version_order("1.0"), version_order("1"));
        assert!(version_order("v2") > version_order("1.99"));
        assert!(version_order("1!0.1") > version_order("9.9"));
        assert!(version_order("nightly") < version_order("0.1"));
    }
}
