#!/usr/bin/env bash
# The Debian package, installed as a user installs it (root; run by tools/test.sh):
#
#   tools/package-test.sh DEB
#
# 1. `apt-get install ./DEB` on a machine without the package (fuse3 pulled in as its
#    dependency); /usr/bin/tensorfs runs and is the version built;
# 2. `man tensorfs-mount` renders, from the installed page (or, where dpkg is told not to
#    install man pages, as Docker images are, from the package's page with `man -l`);
# 3. the bash completion loads and completes a verb;
# 4. `systemd-analyze verify` passes on both installed units;
# 5. a fstab line `STORE MOUNTPOINT fuse.tensorfs defaults,_netdev,… 0 0` mounts with
#    `mount -T FSTAB MOUNTPOINT` (mount.fuse3 runs `tensorfs STORE MOUNTPOINT -o …`), reads right,
#    and `mount -t fuse.tensorfs` refuses an unknown option, naming it;
# 6. reinstalling (an upgrade's path: no maintainer script) leaves that mount live, its daemon
#    unchanged;
# 7. the units' own command lines (ExecStartPre, ExecStart, ExecReload, with %h / %f /
#    $MAINPID filled in and NOTIFY_SOCKET set, as systemd runs them): READY=1 arrives once the
#    mount is live, reload restarts the daemon with the mount still reading right, SIGTERM
#    sends STOPPING=1 and unmounts;
# 8. `dpkg -r tensorfs` removes it. The package is removed whatever happened.
# Needs root, dpkg and apt-get; without them it fails under CI=true and says "skipped"
# elsewhere. A machine that already has a tensorfs package is left alone (skipped).
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

deb="$(realpath "${1:?usage: tools/package-test.sh DEB}")"
skip() {
    if [ "${CI:-}" = true ]; then die "$*"; fi
    log "skipped: $*"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "installing a package needs root"
command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 || skip "no apt-get/dpkg"
if dpkg-query -W -f '${Status}' tensorfs 2>/dev/null | grep -q "install ok installed"; then
    skip "a tensorfs package is installed here already; not replacing it"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tensorfs-package.XXXXXX")"
installed=0
notify_pid=""
finish() {
    local rc=$?
    set +e
    [ -z "$notify_pid" ] || kill "$notify_pid" 2>/dev/null
    mounts_cleanup
    for m in "$work"/mnt*; do [ -d "$m" ] && { is_mounted "$m" && force_unmount "$m"; }; done
    if [ $installed = 1 ]; then dpkg -r tensorfs >/dev/null 2>&1; fi
    if [ $rc -eq 0 ]; then rm -rf "$work"; else log "scratch files kept in $work"; fi
    exit $rc
}
trap finish EXIT

# 1. Install.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" >"$work/apt.log" 2>&1 ||
    { tail -n 20 "$work/apt.log" >&2; die "apt-get install $deb failed"; }
installed=1
[ -x /usr/bin/tensorfs ] || die "/usr/bin/tensorfs is not installed"
want="$(dpkg-deb -f "$deb" Version)"
have="$(/usr/bin/tensorfs --version)"
[ "$have" = "tensorfs ${want%-*}" ] || die "/usr/bin/tensorfs --version says '$have', the package is $want"
log "installed $(basename "$deb"): $have"

# 2. The man page.
page=/usr/share/man/man1/tensorfs-mount.1.gz
if [ ! -f "$page" ]; then
    if grep -qs '^path-exclude=/usr/share/man' /etc/dpkg/dpkg.cfg.d/*; then
        log "dpkg here leaves man pages out (/etc/dpkg/dpkg.cfg.d); reading the package's page"
        dpkg-deb -x "$deb" "$work/root"
        page="$work/root$page"
    else
        die "$page is not installed"
    fi
fi
ensure_apt man-db:man
MANWIDTH=100 man -l "$page" >"$work/man.txt" 2>"$work/man.err" || { cat "$work/man.err" >&2; die "man -l $page failed"; }
grep -q -- "--foreground" "$work/man.txt" && grep -q "^NAME" "$work/man.txt" ||
    die "tensorfs-mount(1) renders without its NAME or --foreground: $(head -c 400 "$work/man.txt")"
log "tensorfs-mount(1) renders ($(wc -l <"$work/man.txt") lines)"

# 3. The bash completion: loaded, it completes `tensorfs mo` to mount.
words="$(bash -c 'source /usr/share/bash-completion/completions/tensorfs
complete -p tensorfs >/dev/null || exit 1
COMP_WORDS=(tensorfs mo); COMP_CWORD=1; COMP_LINE="tensorfs mo"; COMP_POINT=11
_tensorfs tensorfs mo tensorfs; echo "${COMPREPLY[*]}"')" || die "the bash completion does not load"
[[ " $words " == *" mount "* ]] || die "the bash completion of 'tensorfs mo' is '$words'"
log "bash completes 'tensorfs mo' to: $words"

# 4. The units.
ensure_apt systemd:systemd-analyze
for unit in /usr/lib/systemd/user/tensorfs-mount.service /usr/lib/systemd/system/tensorfs@.service; do
    [ -f "$unit" ] || die "$unit is not installed"
    systemd-analyze verify "$unit" >"$work/verify.txt" 2>&1 || { cat "$work/verify.txt" >&2; die "systemd-analyze verify $unit failed"; }
    if [ -s "$work/verify.txt" ]; then cat "$work/verify.txt" >&2; die "systemd-analyze verify $unit complained"; fi
done
log "systemd-analyze verify: both units clean"

# A store holding a small Transformers folder.
src="$work/src"
mkdir -p "$src"
tiny_folder "$src"
store="$work/store"
/usr/bin/tensorfs --store "$store" import "$src" --name local/tiny >/dev/null
file=local/tiny/latest/f32/model.safetensors

# 5. fstab.
mnt="$work/mnt"
mkdir -p "$mnt"
echo "$store $mnt fuse.tensorfs defaults,_netdev,threads=2,allow_other 0 0" >"$work/fstab"
mount -T "$work/fstab" "$mnt" >"$work/mount.txt" 2>&1 || { cat "$work/mount.txt" >&2; die "mount -T FSTAB $mnt failed"; }
_mount_dirs+=("$mnt"); _mount_pids+=("")
is_mounted "$mnt" || die "mount -T returned, but $mnt is not mounted"
cmp -s "$src/model.safetensors" "$mnt/$file" || die "$mnt/$file differs from its source"
log "fstab line mounted: $(cat "$work/mount.txt")"
mkdir -p "$work/mnt-bad"
if mount -t fuse.tensorfs -o turbo "$store" "$work/mnt-bad" >"$work/bad.txt" 2>&1; then
    die "mount -t fuse.tensorfs -o turbo mounted"
fi
grep -q '"turbo"' "$work/bad.txt" || die "an unknown option's refusal does not name it: $(cat "$work/bad.txt")"

# 6. Reinstalled: the mount stays, served by the same daemon.
pid="$(/usr/bin/tensorfs status "$mnt" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["pid"])')"
dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "reinstalling failed"; }
cmp -s "$src/model.safetensors" "$mnt/$file" || die "after reinstalling, $mnt/$file does not read right"
kill -0 "$pid" 2>/dev/null || die "reinstalling stopped the mount's daemon (pid $pid)"
umount "$mnt"
is_mounted "$mnt" && die "umount left $mnt mounted"
log "reinstalling kept the mount and its daemon (pid $pid); umount unmounted it"

# 7. The units' command lines, as systemd runs them.
notify="$work/notify.sock"
python3 - "$notify" "$work/notified.txt" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        out.write(s.recv(4096).decode() + "\n")
PY
notify_pid=$!
for i in $(seq 50); do [ -S "$notify" ] && break; sleep 0.1; done
unit_line() { sed -n "s/^$2=//p" "$1" | head -1; }
status_field() { /usr/bin/tensorfs status "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['$2'])"; }
run_unit() {
    local unit="$1" home="$2" path="$3" pre start pid i server reload
    pre="$(unit_line "$unit" ExecStartPre | sed "s|%h|$home|g; s|%f|$path|g")"
    start="$(unit_line "$unit" ExecStart | sed "s|%h|$home|g; s|%f|$path|g")"
    : >"$work/notified.txt"
    $pre
    # The store is this test's, not the unit's TENSORFS_HOME (/var/lib/tensorfs, ~/.cache).
    NOTIFY_SOCKET="$notify" TENSORFS_HOME="$store" HOME="$home" $start >"$work/unit.log" 2>&1 &
    pid=$!
    _mount_dirs+=("$path"); _mount_pids+=("$pid")
    for i in $(seq 300); do grep -q '^READY=1' "$work/notified.txt" && break; sleep 0.1; done
    grep -q '^READY=1' "$work/notified.txt" || { cat "$work/unit.log" >&2; die "$(basename "$unit"): no READY=1 from '$start'"; }
    is_mounted "$path" || die "$(basename "$unit"): READY=1 before $path was mounted"
    cmp -s "$src/model.safetensors" "$path/$file" || die "$(basename "$unit"): $path/$file differs"
    # reload: the daemon starts again from the installed binary, the mount stays.
    server="$(status_field "$path" server_pid)"
    reload="$(unit_line "$unit" ExecReload | sed "s|\$MAINPID|$pid|g")"
    $reload
    for i in $(seq 100); do [ "$(status_field "$path" server_pid)" != "$server" ] && break; sleep 0.1; done
    [ "$(status_field "$path" restarts)" = 1 ] || die "$(basename "$unit"): '$reload' did not restart the daemon"
    cmp -s "$src/model.safetensors" "$path/$file" || die "$(basename "$unit"): after '$reload', $path/$file differs"
    kill -TERM "$pid"
    wait "$pid" || die "$(basename "$unit"): '$start' exited with $? on SIGTERM"
    grep -q '^STOPPING=1' "$work/notified.txt" || die "$(basename "$unit"): no STOPPING=1 on SIGTERM"
    is_mounted "$path" && die "$(basename "$unit"): SIGTERM left $path mounted"
    log "$(basename "$unit"): '$start' said READY=1 once mounted, restarted its daemon on '$reload', said STOPPING=1 and unmounted on SIGTERM"
}
mkdir -p "$work/home"
run_unit /usr/lib/systemd/user/tensorfs-mount.service "$work/home" "$work/home/models"
run_unit /usr/lib/systemd/system/tensorfs@.service "$work/home" "$work/mnt-srv"

# 8. Removed.
dpkg -r tensorfs >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -r tensorfs failed"; }
installed=0
[ ! -e /usr/bin/tensorfs ] || die "dpkg -r left /usr/bin/tensorfs"
log "removed; package checks passed"
