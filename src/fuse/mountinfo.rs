//! Mounts as `/proc/self/mountinfo` lists them, and the readahead of a mount's bdi.
//!
//! Mountinfo is read rather than `stat`ing the mount point: a `stat` would ask our own daemon
//! (and deadlock before it serves) or fail on a stale mount.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The filesystem type the kernel lists for our mounts (`fuse.<subtype>`).
pub const FSTYPE: &str = "fuse.tensorfs";
/// The source (`fsname`) of our mounts.
pub const FSNAME: &str = "tensorfs";

/// Whether a TensorFS mount is on `mountpoint` (canonical), per `/proc/self/mountinfo`.
pub fn is_mounted(mountpoint: &Path) -> bool {
    find_mount(mountpoint).is_some_and(|m| m.is_ours())
}

/// The user a TensorFS mount on `mountpoint` (canonical) was made by (its `user_id=` option,
/// which FUSE sets to the mounting user's uid), per `/proc/self/mountinfo`; `None` when no such
/// mount is listed or it lists no owner.
pub fn owner(mountpoint: &Path) -> Option<u32> {
    find_mount(mountpoint)
        .filter(MountInfo::is_ours)
        .and_then(|m| m.owner)
}

/// One mount from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MountInfo {
    /// The device number `major:minor` (the bdi's name).
    device: String,
    fstype: String,
    source: String,
    /// The `user_id=` super option: who mounted it (FUSE mounts list it).
    owner: Option<u32>,
}

impl MountInfo {
    /// Ours: type `fuse.tensorfs`, or plain `fuse` with source `tensorfs`, as a root mount
    /// made without `fusermount3` is listed (fuser's own mount(2) sets no subtype).
    fn is_ours(&self) -> bool {
        self.fstype == FSTYPE || (self.fstype == "fuse" && self.source == FSNAME)
    }
}

/// The topmost mount on `mountpoint`. Read from mountinfo rather than by `stat`, which would
/// ask our own daemon (and deadlock before it serves) or fail on a stale mount.
fn find_mount(mountpoint: &Path) -> Option<MountInfo> {
    entries()
        .into_iter()
        .rev()
        .find(|(path, _)| path == mountpoint)
        .map(|(_, info)| info)
}

/// The mount points of every TensorFS mount this process sees, in mount order (a mount point
/// mounted over lists its topmost mount only if that is ours).
pub fn mounts() -> Vec<PathBuf> {
    let entries = entries();
    let mut out: Vec<PathBuf> = Vec::new();
    for (i, (path, info)) in entries.iter().enumerate() {
        let topmost = !entries[i + 1..].iter().any(|(p, _)| p == path);
        if topmost && info.is_ours() {
            out.push(path.clone());
        }
    }
    out
}

/// Every mount of `/proc/self/mountinfo`, in its order.
fn entries() -> Vec<(PathBuf, MountInfo)> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse(&text))
        .unwrap_or_default()
}

/// The mounts of mountinfo `text` (proc(5): `… mount-point … - fstype source super-options`).
fn parse(text: &str) -> Vec<(PathBuf, MountInfo)> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let path = PathBuf::from(unescape(fields.get(4)?));
            let device = fields.get(2)?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let source = unescape(right.next().unwrap_or(""));
            let owner = right
                .next()
                .unwrap_or("")
                .split(',')
                .find_map(|option| option.strip_prefix("user_id=")?.parse().ok());
            Some((
                path,
                MountInfo {
                    device: device.to_string(),
                    fstype: fstype.to_owned(),
                    source,
                    owner,
                },
            ))
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Sets the readahead window of the mount's bdi (FUSE's `max_readahead` is capped at what the
/// kernel offered, 128 KiB; the bdi's `read_ahead_kb` is not).
pub(super) fn set_read_ahead(mountpoint: &Path, kb: u32) -> io::Result<()> {
    let info =
        find_mount(mountpoint).ok_or_else(|| io::Error::other("not in /proc/self/mountinfo"))?;
    let path = PathBuf::from(format!("/sys/class/bdi/{}/read_ahead_kb", info.device));
    fs::write(&path, format!("{kb}\n"))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    tracing::debug!("{}: read_ahead_kb = {kb}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/mnt/tab\011x\134y"), "/mnt/tab\tx\\y");
        assert_eq!(unescape(r"/plain\0"), r"/plain\0");
    }

    #[test]
    fn a_root_mount_without_fusermount3_is_ours_too() {
        // As Linux 6.18 lists a mount fuser made itself (no fusermount3 installed), beside one
        // fusermount3 made, another FUSE filesystem, and a fuse mount of another name.
        let text =
            "45 27 0:40 / /tmp/um/mnt ro,nosuid,nodev,relatime - fuse tensorfs ro,user_id=0\n\
                    46 27 0:41 / /tmp/b ro,nosuid,nodev - fuse.tensorfs tensorfs ro,user_id=0\n\
                    47 27 0:42 / /tmp/c rw - fuse.sshfs host:/ rw\n\
                    48 27 0:43 / /tmp/d rw - fuse other rw\n";
        let ours: Vec<String> = parse(text)
            .into_iter()
            .filter(|(_, m)| m.is_ours())
            .map(|(p, _)| p.display().to_string())
            .collect();
        assert_eq!(ours, ["/tmp/um/mnt", "/tmp/b"]);
    }

    #[test]
    fn the_mounting_users_uid_is_read_from_the_super_options() {
        let text = "46 27 0:41 / /tmp/b ro,nosuid - fuse.tensorfs tensorfs ro,user_id=1001,group_id=1001,allow_other\n\
                    47 27 0:42 / /tmp/c rw - fuse.tensorfs tensorfs rw\n";
        let owners: Vec<Option<u32>> = parse(text).into_iter().map(|(_, m)| m.owner).collect();
        assert_eq!(owners, [Some(1001), None]);
    }

    #[test]
    fn the_root_folder_is_found_in_mountinfo() {
        let root = find_mount(Path::new("/")).expect("/ is mounted");
        assert!(root.device.contains(':'), "{root:?}");
    }
}
