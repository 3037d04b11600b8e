#!/usr/bin/env bash
# A user other than root, on a system set up as Debian and Ubuntu ship it (`/dev/fuse` mode
# 0666, `fusermount3` setuid root), uses TensorFS (run by tools/test.sh, as root):
#
#   tools/unprivileged-test.sh
#
# creates the user `tensorfs-test` (once; kept for the next run); `tensorfs doctor` as that user
# fails naming `/dev/fuse` and its fix while the device is closed to it; makes `/dev/fuse` 0666
# for the run (its mode is put back afterwards), where doctor passes (passthrough a warning:
# no CAP_SYS_ADMIN), then as that user: imports a small Transformers
# folder into a store in its home, mounts it in the background (no views: they need
# CAP_SYS_ADMIN, and the mount says nothing about them), reads every file back equal, sees
# `tensorfs status` report the mount, kills its own daemon (-9) and reads on through the one
# its supervisor starts, is refused `--allow-other` with the fix when
# /etc/fuse.conf lacks `user_allow_other`, mounts with it once the line is there (fuse.conf is
# put back afterwards), and unmounts; nothing is left mounted. Needs root (to create the user);
# without it, it fails under CI=true and says "skipped" elsewhere.
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

skip() {
    if [ "${CI:-}" = true ]; then die "$*"; fi
    log "skipped: $*"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "creating a user needs root"
[ -e /dev/fuse ] || skip "no /dev/fuse"
command -v fusermount3 >/dev/null 2>&1 || die "fusermount3 is missing (apt install fuse3)"
[ -u "$(command -v fusermount3)" ] || die "fusermount3 is not setuid root, as fuse3 installs it"

user=tensorfs-test
id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
home="$(getent passwd "$user" | cut -d: -f6)"
# The binary, somewhere the user may run it from (the build tree may be under /root).
work="$(mktemp -d "${TMPDIR:-/tmp}/tensorfs-user.XXXXXX")"
chmod 755 "$work"
install -m 755 "$TENSORFS_BIN" "$work/tensorfs"
fuse_mode="$(stat -c %a /dev/fuse)"
conf_saved=""
if [ -e /etc/fuse.conf ]; then conf_saved="$work/fuse.conf"; cp -p /etc/fuse.conf "$conf_saved"; fi
as_user() { runuser -u "$user" -- env -i HOME="$home" PATH=/usr/bin:/bin "$@"; }
mnt="$home/models"
finish() {
    local rc=$?
    set +e
    if is_mounted "$mnt"; then as_user fusermount3 -uz "$mnt"; force_unmount "$mnt"; fi
    if is_mounted "$work/root-mnt"; then force_unmount "$work/root-mnt"; fi
    chmod "$fuse_mode" /dev/fuse
    if [ -n "$conf_saved" ]; then cp -p "$conf_saved" /etc/fuse.conf; else rm -f /etc/fuse.conf; fi
    if [ $rc -eq 0 ]; then rm -rf "$work"; else log "scratch files kept in $work"; fi
    exit $rc
}
trap finish EXIT
# doctor: /dev/fuse closed to the user is what fails, named with its fix; open, all passes.
if out="$(runuser -u "$user" -- "$work/tensorfs" doctor --store "$home/store" 2>&1)"; then
    [ "$fuse_mode" = 666 ] || die "doctor passed with /dev/fuse $fuse_mode: $out"
else
    grep -q '^fail  /dev/fuse .*may not open it' <<<"$out" && grep -q 'chmod 0666 /dev/fuse' <<<"$out" ||
        die "doctor's /dev/fuse finding: $out"
fi
chmod 666 /dev/fuse
out="$(runuser -u "$user" -- "$work/tensorfs" doctor --json --store "$home/store")" || die "doctor fails with /dev/fuse 0666: $out"
python3 - "$out" <<'PY' || die "doctor --json as the user: $out"
import json, sys
said = {f["check"]: f for f in json.loads(sys.argv[1])}
assert said["/dev/fuse"]["status"] == "ok", said["/dev/fuse"]
assert said["passthrough"]["status"] == "warn" and "CAP_SYS_ADMIN" in said["passthrough"]["finding"], said["passthrough"]
assert not [f for f in said.values() if f["status"] == "fail"], said
PY

# A small Transformers folder, the user's.
src="$home/src"
as_user rm -rf "$src" "$home/store" "$mnt"
as_user mkdir -p "$src" "$mnt"
tiny_folder "$src" as_user
tfs=("$work/tensorfs" --store "$home/store")
as_user "${tfs[@]}" import "$src" --name local/tiny >/dev/null
out="$(as_user "${tfs[@]}" mount "$mnt" 2>&1)" || die "mounting as $user failed: $out"
log "as $user: $out"
lane="$mnt/local/tiny/latest/f32"
for f in model.safetensors config.json; do
    as_user cmp -s "$src/$f" "$lane/$f" || die "as $user, $lane/$f differs from its source"
done
status="$(as_user "$work/tensorfs" status "$mnt" --json)" || die "tensorfs status failed: $status"
python3 - "$status" <<'PY' || die "status as the user: $status"
import json, sys
s = json.loads(sys.argv[1])[0]
assert s["views"] is None, f"views on an unprivileged mount: {s['views']}"
assert s["opens"] >= 2, s
PY
# The user's daemon killed: its supervisor (also the user's) starts another, and the mount
# reads on. Files read before are read again from a dropped page cache.
pids="$(python3 -c 'import json,sys; s=json.loads(sys.argv[1])[0]; print(s["pid"], s["server_pid"])' "$status")"
read -r supervisor server <<<"$pids"
as_user kill -9 "$server" || die "$user may not kill its own daemon (pid $server)"
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0][sys.argv[2]])' "$1" "$2"; }
restarts=""
for i in $(seq 100); do
    now="$(as_user "$work/tensorfs" status "$mnt" --json 2>/dev/null)" && restarts="$(field "$now" restarts)"
    [ "$restarts" = 1 ] && break
    sleep 0.1
done
[ "$restarts" = 1 ] || die "no daemon took over from the killed one (pid $server): ${now:-}"
[ "$(field "$now" pid)" = "$supervisor" ] || die "the supervisor changed: $now"
echo 3 >/proc/sys/vm/drop_caches
for f in model.safetensors config.json; do
    as_user cmp -s "$src/$f" "$lane/$f" || die "as $user, after a restart, $lane/$f differs from its source"
done
# Root reads nothing of a user's mount without allow_other (the kernel's rule).
if cat "$lane/config.json" >/dev/null 2>&1; then die "root read a user's mount made without allow_other"; fi
as_user "$work/tensorfs" unmount "$mnt" >/dev/null
is_mounted "$mnt" && die "unmount as $user left $mnt mounted"

# allow_other: refused with the fix, then allowed by /etc/fuse.conf.
sed -i '/^[[:space:]]*user_allow_other/d' /etc/fuse.conf 2>/dev/null || true
if out="$(as_user "${tfs[@]}" mount "$mnt" --allow-other 2>&1)"; then
    as_user "$work/tensorfs" unmount "$mnt" >/dev/null
    die "--allow-other was not refused without user_allow_other: $out"
fi
[[ "$out" == *user_allow_other* && "$out" == */etc/fuse.conf* ]] || die "the refusal does not say the fix: $out"
echo user_allow_other >>/etc/fuse.conf
out="$(as_user "${tfs[@]}" mount "$mnt" --allow-other 2>&1)" || die "--allow-other with user_allow_other failed: $out"
cmp -s "$src/config.json" "$lane/config.json" || die "root cannot read a user's allow_other mount"
as_user "$work/tensorfs" unmount "$mnt" >/dev/null
is_mounted "$mnt" && die "unmount as $user left $mnt mounted"

# Another user's mount: the user is told whose it is (fusermount3 says only "not found in
# /etc/mtab").
rootmnt="$work/root-mnt"
mkdir -p "$rootmnt"
"$work/tensorfs" --store "$work/root-store" import "$src" --name local/tiny >/dev/null
"$work/tensorfs" --store "$work/root-store" mount "$rootmnt" >/dev/null || die "root could not mount $work/root-store"
if out="$(as_user "$work/tensorfs" unmount "$rootmnt" 2>&1)"; then
    force_unmount "$rootmnt"
    die "$user unmounted root's mount: $out"
fi
is_mounted "$rootmnt" || die "$user's refused unmount left root's mount unmounted"
"$work/tensorfs" unmount "$rootmnt" >/dev/null || force_unmount "$rootmnt"
[[ "$out" == *"mounted by user root (uid 0)"* ]] || die "the refusal does not say whose mount it is: $out"
log "as $user: import, mount, read, status, a restart after kill -9, allow_other (refused, then allowed), unmount, and another user's mount refused, naming its owner, work"
