#!/usr/bin/env bash
# The hub cache end-to-end check: a cache written by huggingface_hub imported whole with
# `tensorfs import --hf-cache`, mounted, and loaded by repo id through MOUNT/@hf.
#
#   tools/e2e/hf_cache_e2e.sh        (after cargo build --release; uses tools/venv.sh's python)
#
# 1. tiny_sd.py --fp16-distinct builds a tiny Stable Diffusion folder with an fp16 variant;
#    tools/fixtures/hub_cache.py serves it and the real all-MiniLM-L6-v2 folder as hub repos
#    acme/tiny-sd and sentence-transformers/all-MiniLM-L6-v2 to huggingface_hub's own
#    snapshot_download, which writes the cache;
# 2. tensorfs import --hf-cache of that cache into a fresh store (its summary is printed), then
#    tensorfs mount of the store;
# 3. hf_view_check.py with HF_HUB_CACHE=MOUNT/@hf, offline and online against an unreachable
#    and a refusing endpoint: Transformers, sentence-transformers and huggingface_hub by repo id
#    (and by revision), and DiffusionPipeline by repo id with and without variant="fp16".
# The mount is always unmounted; the scratch folder is removed unless KEEP_E2E=1.
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

e2e_traps "hub cache e2e"

[ -x "$TENSORFS_BIN" ] || die "$TENSORFS_BIN is missing: run cargo build --release first"
py="$(venv_python)"
e2e="$TENSORFS_ROOT/tools/e2e"
work="$(mktemp -d "${TMPDIR:-/tmp}/tensorfs-hf-e2e.XXXXXX")"
minilm="$(minilm_dir "$py")"
minilm_id=sentence-transformers/all-MiniLM-L6-v2

step "tiny_sd.py --fp16-distinct" "$py" "$e2e/tiny_sd.py" "$work/src/tiny-sd" --fp16-distinct
step "hub_cache.py: $minilm_id" "$py" "$TENSORFS_ROOT/tools/fixtures/hub_cache.py" \
    --folder "$minilm" --repo "$minilm_id" --cache "$work/hub"
step "hub_cache.py: acme/tiny-sd" "$py" "$TENSORFS_ROOT/tools/fixtures/hub_cache.py" \
    --folder "$work/src/tiny-sd" --repo acme/tiny-sd --cache "$work/hub"
step "tensorfs import --hf-cache" "$TENSORFS_BIN" --store "$work/store" import --hf-cache "$work/hub"
step "tensorfs import --hf-cache --json (again: up to date)" \
    sh -c '"$1" --store "$2" import --hf-cache "$3" --json > "$4"' _ "$TENSORFS_BIN" "$work/store" "$work/hub" "$work/again.json"
step "the second import found everything up to date, reading nothing" "$py" - "$work/again.json" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))["summary"]
if (summary["up_to_date"], summary["imported"], summary["skipped"], summary["bytes_read"]) != (2, 0, 0, 0):
    sys.exit(f"expected 2 snapshots up to date and 0 bytes read: {summary}")
PY
# A TensorFS commit id of MiniLM, which revision= must resolve too.
ours="$("$TENSORFS_BIN" --store "$work/store" ls --json | "$py" -c '
import json, sys
rows = json.load(sys.stdin)
print(next(r["commit"] for r in rows if r["repo"] == "local/sentence-transformers--all-MiniLM-L6-v2"))')"
[ -n "$ours" ] || die "no MiniLM commit in the store"
step "tensorfs mount" mount_store "$work/store" "$work/mnt" "$work/mount.log"
step "hf_view_check.py transformers $minilm_id" "$py" "$e2e/hf_view_check.py" transformers \
    --cache "$work/mnt/@hf" --repo "$minilm_id" --source "$minilm" --commit "$ours"
step "hf_view_check.py diffusers acme/tiny-sd" "$py" "$e2e/hf_view_check.py" diffusers \
    --cache "$work/mnt/@hf" --repo acme/tiny-sd --source "$work/src/tiny-sd"
result="PASS — a huggingface_hub cache imported whole; MiniLM and tiny SD (fp16 variant) load by repo id through @hf offline, unreachable and refused"
