//! Mounts as `/proc/self/mountinfo` lists them, and the readahead of a mount's bdi.
//!
//! Mountinfo is read rather than `stat`ing the mount point: a `stat` would ask our own daemon
//! (and deadlock before it serves) or fail on a stale mount.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The filesystem type the kernel lists for our mounts (`fuse.<subtype>`).
pub const FSTYPE: &str = "fuse.tensorfs";
/// Whether a TensorFS mount is on `mountpoint` (canonical), per `/proc/self/mountinfo`.
pub fn is_mounted(mountpoint: &Path) -> bool {
    find_mount(mountpoint).is_some_and(|m| m.fstype == FSTYPE)
}

/// One mount from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MountInfo {
    /// The device number `major:minor` (the bdi's name).
    device: String,
    fstype: String,
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
        if topmost && info.fstype == FSTYPE {
            out.push(path.clone());
        }
    }
    out
}

/// Every mount of `/proc/self/mountinfo`, in its order.
fn entries() -> Vec<(PathBuf, MountInfo)> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let path = PathBuf::from(unescape(fields.get(4)?));
            let device = fields.get(2)?;
            let fstype = right.split(' ').next()?;
            Some((
                path,
                MountInfo {
                    device: device.to_string(),
                    fstype: fstype.to_owned(),
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
    fn the_root_folder_is_found_in_mountinfo() {
        let root = find_mount(Path::new("/")).expect("/ is mounted");
        assert!(root.device.contains(':'), "{root:?}");
    }
}
