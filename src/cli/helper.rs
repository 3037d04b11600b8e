//! The command line `mount(8)` gives a filesystem's helper: `tensorfs STORE MOUNTPOINT -o OPTS`.
//!
//! For `mount -t fuse.tensorfs STORE MOUNTPOINT -o …` and the fstab line
//! `STORE MOUNTPOINT fuse.tensorfs defaults,_netdev 0 0`, `mount(8)` runs `mount.fuse3`, which
//! runs `tensorfs STORE MOUNTPOINT -o OPTS` (no verb; it adds `dev,suid` as root and strips
//! `user`, `nofail`, `_netdev`, `auto`, `noauto`); a `mount.fuse.tensorfs` helper is called as
//! `mount.fuse.tensorfs STORE MOUNTPOINT [-sfnv] [-o OPTS] [-t TYPE]` (util-linux's
//! `mount(8)`, "External helpers"). Either becomes `tensorfs --store STORE mount MOUNTPOINT
//! FLAGS`, which returns once the mount is live, as `mount(8)` expects.

use std::ffi::{OsStr, OsString};

/// A mount option and the `mount` flag it sets (`endpoint=URL` → `--endpoint URL`).
const VALUED: [(&str, &str); 8] = [
    ("endpoint", "--endpoint"),
    ("repo", "--repo"),
    ("cache_size", "--cache-size"),
    ("fetch_deadline", "--fetch-deadline"),
    ("view_cache", "--view-cache"),
    ("view_dir", "--view-dir"),
    ("threads", "--threads"),
    ("log_file", "--log-file"),
];

/// Options that say nothing to this mount: what the kernel and `mount(8)` handle (the mount is
/// always read-only, `nodev` and `nosuid`, so `rw`, `dev` and `suid` change nothing), and
/// fstab's own.
const IGNORED: [&str; 27] = [
    "defaults",
    "ro",
    "rw",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "async",
    "sync",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "diratime",
    "nodiratime",
    "lazytime",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "nofail",
    "_netdev",
    "default_permissions",
];

/// The verb command line a helper's `args` (with the program's name first) stand for, or `None`
/// when they are not a helper's (a verb, a flag, too few words, or a first word that is no
/// path, `tensorfs#PATH` nor folder).
///
/// # Errors
/// An option this mount does not know, or one without its value, named.
pub fn translate(
    args: &[OsString],
    is_verb: impl Fn(&OsStr) -> bool,
) -> Option<Result<Vec<OsString>, String>> {
    let (program, rest) = args.split_first()?;
    let [source, mountpoint, options @ ..] = rest else {
        return None;
    };
    let starts_flag = |a: &OsString| a.as_encoded_bytes().starts_with(b"-");
    // A store is a path (fstab's are absolute) or an existing folder, so a mistyped verb
    // (`tensorfs improt DIR`) stays clap's error, with its suggestion.
    let bytes = source.as_encoded_bytes();
    let store_like = bytes.contains(&b'/')
        || bytes.starts_with(b"tensorfs#")
        || std::path::Path::new(source).is_dir();
    if !store_like || starts_flag(source) || starts_flag(mountpoint) || is_verb(source) {
        return None;
    }
    Some(rewrite(program, source, mountpoint, options))
}

fn rewrite(
    program: &OsString,
    source: &OsString,
    mountpoint: &OsString,
    options: &[OsString],
) -> Result<Vec<OsString>, String> {
    // `mount.fuse3 tensorfs#STORE …` names the program before `#`.
    let store = match source.to_str().and_then(|s| s.strip_prefix("tensorfs#")) {
        Some("") => return Err("no store before the mount point (tensorfs#STORE)".into()),
        Some(store) => OsString::from(store),
        None => source.clone(),
    };
    // mount.fuse3's drop_privileges mounts itself and hands over /dev/fd/N.
    if mountpoint.as_encoded_bytes().starts_with(b"/dev/fd/") {
        return Err(format!(
            "the mount point {} is a descriptor (mount.fuse3's drop_privileges), which tensorfs \
             does not take: mount without drop_privileges",
            mountpoint.to_string_lossy()
        ));
    }
    let mut out: Vec<OsString> = vec![program.clone(), "--store".into(), store, "mount".into()];
    out.push(mountpoint.clone());
    let mut given: Vec<String> = Vec::new();
    let mut words = options.iter();
    while let Some(word) = words.next() {
        match word.to_str() {
            Some("-o") => {
                let list = words.next().ok_or("-o without its options")?;
                let list = list
                    .to_str()
                    .ok_or_else(|| format!("the mount options {list:?} are not UTF-8"))?;
                for option in split_options(list).iter().filter(|o| !o.is_empty()) {
                    let option = option.as_str();
                    let set = flags(option)?;
                    let name = option.split('=').next().unwrap_or(option);
                    if !set.is_empty() && name != "repo" {
                        if given.iter().any(|g| g == name) {
                            return Err(format!("the mount option {name} is given twice"));
                        }
                        given.push(name.to_owned());
                    }
                    out.extend(set);
                }
            }
            // The type (`fuse.tensorfs`), and util-linux's sloppy, verbose and no-mtab flags.
            Some("-t") => {
                words.next();
            }
            Some("-s" | "-v" | "-n") => {}
            Some(other) => {
                return Err(format!(
                    "{other:?} is no mount helper argument (STORE MOUNTPOINT [-o OPTIONS])"
                ))
            }
            None => return Err(format!("{word:?} is not UTF-8")),
        }
    }
    let has = |name: &str| given.iter().any(|g| g == name);
    if let Some(needs) = ["cache_size", "repo"].into_iter().find(|n| has(n)) {
        if !has("endpoint") {
            return Err(format!(
                "the mount option {needs} is for a mount over an endpoint: add endpoint=URL"
            ));
        }
    }
    Ok(out)
}

/// The `mount` flags one option sets.
fn flags(option: &str) -> Result<Vec<OsString>, String> {
    let (name, value) = match option.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (option, None),
    };
    if let Some((_, flag)) = VALUED.iter().find(|(n, _)| *n == name) {
        let value = value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the mount option {name} needs a value ({name}=…)"))?;
        // One word, so a value starting with `-` stays the flag's.
        return Ok(vec![format!("{flag}={value}").into()]);
    }
    match (name, value) {
        ("allow_other", None) => Ok(vec!["--allow-other".into()]),
        (name, None) if IGNORED.contains(&name) => Ok(Vec::new()),
        // fstab's comments and systemd's and desktops' own options (x-systemd.automount).
        (name, _) if name.starts_with("x-") || name == "comment" => Ok(Vec::new()),
        _ => Err(format!(
            "the mount option {option:?} is not one of tensorfs's ({}) nor one it ignores ({})",
            taken(),
            ignored()
        )),
    }
}

/// The options that set a flag, as written in fstab: `endpoint=, …, allow_other`.
fn taken() -> String {
    let valued = VALUED.map(|(name, _)| format!("{name}="));
    format!("{}, allow_other", valued.join(", "))
}

/// The options accepted and ignored, as written in fstab.
/// The options of a comma-separated `-o` list, as libfuse's `fuse_opt` reads one: a
/// backslash takes the next character as it is, so `log_file=/var/log/a\,b.log` is one
/// option (a value with a comma), and `\\` a backslash.
fn split_options(list: &str) -> Vec<String> {
    let mut options = vec![String::new()];
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let next = chars.next().unwrap_or('\\');
                options.last_mut().expect("one option").push(next);
            }
            ',' => options.push(String::new()),
            c => options.last_mut().expect("one option").push(c),
        }
    }
    options
}

fn ignored() -> String {
    format!("{}, x-*, comment=", IGNORED.join(", "))
}

/// What `mount --help` and tensorfs-mount(1) say of this command line, from the same tables
/// the translation reads.
pub fn help() -> String {
    format!(
        "From fstab and mount(8): a line `STORE MOUNTPOINT fuse.tensorfs defaults,_netdev 0 0`, \
         or `mount -t fuse.tensorfs STORE MOUNTPOINT -o OPTIONS`, runs `tensorfs STORE \
         MOUNTPOINT -o OPTIONS`, which is this verb in the background with --store STORE. The \
         options {} set this verb's flags of those names (a comma inside a value is written \
         `\\,`, as libfuse reads options); {} change nothing; any other is refused by name.",
        taken(),
        ignored()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    /// `t /s /m -o OPTIONS` translated.
    fn mounted_with(options: &str) -> Option<Result<Vec<OsString>, String>> {
        translate(&args(&["t", "/s", "/m", "-o", options]), verb)
    }

    /// `t --store /s mount /m FLAGS`.
    fn mount_args(flags: &[&str]) -> Vec<OsString> {
        let mut words = args(&["t", "--store", "/s", "mount", "/m"]);
        words.extend(args(flags));
        words
    }

    fn verb(word: &OsStr) -> bool {
        word == "mount" || word == "ls"
    }

    #[test]
    fn mount_fuse3s_command_line_becomes_a_background_mount() {
        let said = translate(
            &args(&[
                "tensorfs",
                "/srv/store",
                "/srv/models",
                "-o",
                "rw,dev,suid,endpoint=https://e.example,cache_size=20G,allow_other,x-systemd.automount",
            ]),
            verb,
        );
        assert_eq!(
            said,
            Some(Ok(args(&[
                "tensorfs",
                "--store",
                "/srv/store",
                "mount",
                "/srv/models",
                "--endpoint=https://e.example",
                "--cache-size=20G",
                "--allow-other",
            ])))
        );
        // A mount.fuse.tensorfs helper's form, with the type and util-linux's flags.
        let said = translate(
            &args(&[
                "m",
                "tensorfs#/s",
                "/m",
                "-n",
                "-t",
                "fuse.tensorfs",
                "-o",
                "ro",
            ]),
            verb,
        );
        assert_eq!(said, Some(Ok(args(&["m", "--store", "/s", "mount", "/m"]))));
    }

    #[test]
    fn a_backslash_escapes_a_comma_in_a_value_as_libfuse_reads_options() {
        assert_eq!(
            split_options(r"ro,log_file=/l/a\,b.log,x\\y,end\"),
            ["ro", "log_file=/l/a,b.log", r"x\y", r"end\"]
        );
        assert_eq!(
            mounted_with(r"ro,log_file=/l/a\,b.log,threads=2"),
            Some(Ok(mount_args(&["--log-file=/l/a,b.log", "--threads=2"])))
        );
    }

    #[test]
    fn verbs_and_flags_are_no_helper_command_line() {
        for words in [
            &["tensorfs", "mount", "/m"][..],
            &["tensorfs", "ls", "a", "b"],
            &["tensorfs", "--store", "/s", "ls"],
            &["tensorfs", "/s"],
            &["tensorfs", "improt", "./folder", "--name", "local/x"],
        ] {
            assert_eq!(translate(&args(words), verb), None, "{words:?}");
        }
    }

    #[test]
    fn unknown_or_empty_options_are_refused_by_name() {
        for (options, named) in [
            ("ro,turbo", "\"turbo\""),
            ("endpoint=", "endpoint needs a value"),
            ("cache_size", "cache_size needs a value"),
            ("threads=2,threads=3", "threads is given twice"),
            ("cache_size=1G", "add endpoint=URL"),
        ] {
            let said = translate(&args(&["t", "/s", "/m", "-o", options]), verb);
            let Some(Err(why)) = said else {
                panic!("{options}: {said:?}")
            };
            assert!(why.contains(named), "{options}: {why}");
        }
        let said = translate(&args(&["t", "/s", "/m", "-x"]), verb);
        assert!(matches!(said, Some(Err(why)) if why.contains("\"-x\"")));
        let said = translate(&args(&["t", "/s", "/dev/fd/3"]), verb);
        assert!(matches!(said, Some(Err(why)) if why.contains("drop_privileges")));
        let said = translate(&args(&["t", "tensorfs#", "/m"]), verb);
        assert!(matches!(said, Some(Err(why)) if why.contains("no store")));
        // A value starting with `-` stays the option's.
        assert_eq!(
            mounted_with("log_file=-x.log"),
            Some(Ok(mount_args(&["--log-file=-x.log"])))
        );
    }
}
