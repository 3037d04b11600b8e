#!/usr/bin/env bash
# The main job (README command 1): import the real all-MiniLM-L6-v2 folder, mount it, and check
# that Transformers reads the mounted lane exactly as it reads the original.
#
#   tools/main-job.sh
#
# 1. apt packages fuse3 and attr when missing (root; else it says what to install);
# 2. cargo build --release;
# 3. the Python venv (tools/venv.sh; TENSORFS_VENV=/path uses an existing one);
# 4. tensorfs import of the folder as local/all-minilm-l6-v2 into $TENSORFS_HOME when set, else a
#    fresh store under ${TENSORFS_DEV_CACHE:-~/.cache/tensorfs-dev} (removed afterwards);
# 5. tensorfs mount at a temporary mount point; the lane folder is found by listing
#    MOUNT/local/all-minilm-l6-v2/latest/;
# 6. tools/e2e/minilm_check.py: embeddings equal (torch.equal) and every file's SHA-256 equal.
# The mount is always unmounted. The last line says PASS or FAIL; the exit code says the same.
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

repo="local/all-minilm-l6-v2"
made_store=""
mnt=""
daemon_log=""
check_log=""
phase="setup"
result=""

finish() {
    local rc=$?
    set +e
    mounts_cleanup
    [ -n "$mnt" ] && rmdir "$mnt" 2>/dev/null
    [ -n "$made_store" ] && rm -rf "$made_store"
    if [ $rc -ne 0 ] && [ -n "$daemon_log" ] && [ -s "$daemon_log" ]; then
        log "the mount daemon's log (last lines):"
        tail -n 20 "$daemon_log" >&2
    fi
    [ -n "$daemon_log" ] && rm -f "$daemon_log"
    [ -n "$check_log" ] && rm -f "$check_log"
    if [ -z "$result" ] || { [ $rc -ne 0 ] && [[ "$result" == PASS* ]]; }; then
        result="FAIL — $phase failed (exit code $rc)"
    fi
    echo "main job: $result"
    exit $rc
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

phase="apt packages"
step "apt packages (fuse3, attr)" ensure_apt fuse3:fusermount3 attr:getfattr
phase="cargo build --release"
step "cargo build --release" build_release
phase="tools/venv.sh"
py="$(venv_python)"
log "python: $py"
source_dir="$(minilm_dir "$py")" || { result="FAIL — no all-MiniLM-L6-v2 folder"; exit 1; }
[ -f "$source_dir/model.safetensors" ] || { result="FAIL — $source_dir has no model.safetensors"; exit 1; }

if [ -n "${TENSORFS_HOME:-}" ]; then
    store="$TENSORFS_HOME"
else
    mkdir -p "$TENSORFS_DEV_CACHE"
    store="$(mktemp -d "$TENSORFS_DEV_CACHE/main-job-store.XXXXXX")"
    made_store="$store"
fi
mnt="$(mktemp -d "${TMPDIR:-/tmp}/tensorfs-main-job.XXXXXX")"
daemon_log="$(mktemp "${TMPDIR:-/tmp}/tensorfs-main-job-mount.XXXXXX")"

phase="tensorfs import"
step "tensorfs import $source_dir as $repo (store $store)" \
    "$TENSORFS_BIN" --store "$store" import "$source_dir" --name "$repo"
phase="tensorfs mount"
step "tensorfs mount at $mnt" mount_store "$store" "$mnt" "$daemon_log"

phase="minilm_check.py"
latest="$mnt/$repo/latest"
lanes="$(lanes_of "$latest" 2>/dev/null)" || true
case "$(printf '%s\n' "$lanes" | grep -c .)" in
    0) result="FAIL — no lane folders under $latest"; exit 1 ;;
    1) lane="$lanes" ;;
    *)
        if printf '%s\n' "$lanes" | grep -qx f32; then lane=f32; else
            result="FAIL — several lanes under $latest (${lanes//$'\n'/ }) and none is f32"; exit 1
        fi ;;
esac
log "checking lane $latest/$lane against $source_dir"

check_log="$(mktemp "${TMPDIR:-/tmp}/tensorfs-main-job-check.XXXXXX.log")"
set +e
"$py" "$TENSORFS_ROOT/tools/e2e/minilm_check.py" --source "$source_dir" --mounted "$latest/$lane" 2>&1 | tee "$check_log"
check_rc=${PIPESTATUS[0]}
set -e
line="$(grep '^RESULT: ' "$check_log" | tail -n 1)"
result="${line#RESULT: }"
[ -n "$result" ] || result="FAIL — minilm_check.py exited $check_rc without a result"
if [ "$check_rc" -ne 0 ]; then
    [[ "$result" == PASS* ]] && result="FAIL — minilm_check.py exited $check_rc"
    exit 1
fi
