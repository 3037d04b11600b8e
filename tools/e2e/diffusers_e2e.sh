#!/usr/bin/env bash
# The Diffusers end-to-end check: tiny Stable Diffusion folders imported, mounted, and loaded
# by an unmodified StableDiffusionPipeline from each lane.
#
#   tools/e2e/diffusers_e2e.sh        (after cargo build --release; uses tools/venv.sh's python)
#
# 1. tiny_sd.py builds local/tiny-sd (sharded UNet, fp16 variant for every component) and
#    local/tiny-sd-partial (no fp16 VAE: its fp16 lane falls back to the default VAE files);
# 2. tensorfs import of both into a fresh store; tensorfs mount of it;
# 3. sd_check.py on MOUNT/local/tiny-sd/latest/<default lane> (float32), on .../latest/fp16
#    (variant="fp16", float16 on CPU), and on MOUNT/local/tiny-sd-partial/latest/fp16.
# The mount is always unmounted; the scratch folder is removed unless KEEP_E2E=1.
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

e2e_traps "diffusers e2e"

[ -x "$TENSORFS_BIN" ] || die "$TENSORFS_BIN is missing: run cargo build --release first"
py="$(venv_python)"
e2e="$TENSORFS_ROOT/tools/e2e"
work="$(mktemp -d "${TMPDIR:-/tmp}/tensorfs-sd-e2e.XXXXXX")"
store="$work/store"
mnt="$work/mnt"

step "tiny_sd.py: local/tiny-sd" "$py" "$e2e/tiny_sd.py" "$work/src/tiny-sd"
step "tiny_sd.py: local/tiny-sd-partial (no fp16 vae)" "$py" "$e2e/tiny_sd.py" "$work/src/tiny-sd-partial" --fp16-skip vae
for name in tiny-sd tiny-sd-partial; do
    step "tensorfs import local/$name" "$TENSORFS_BIN" --store "$store" import "$work/src/$name" --name "local/$name"
done
step "tensorfs mount" mount_store "$store" "$mnt" "$work/mount.log"

# The default lane is the one that is not fp16 (named by its dtype, f32 here). Faces of a lane
# (`<lane>@single`, the single file an SD 1.x pipeline's components make) are no lanes.
listed="$(lanes_of "$mnt/local/tiny-sd/latest" 2>/dev/null)" || true
lanes="$(printf '%s\n' "$listed" | grep -v @ || true)"
default_lane="$(printf '%s\n' "$lanes" | grep -vx fp16 || true)"
if [ "$(printf '%s\n' "$default_lane" | grep -c .)" != 1 ] || ! printf '%s\n' "$lanes" | grep -qx fp16; then
    die "expected lanes fp16 and one default lane under $mnt/local/tiny-sd/latest, found: ${listed//$'\n'/ }"
fi
if ! printf '%s\n' "$listed" | grep -qx "$default_lane@single"; then
    die "expected the SD 1.x pipeline's single-file face $default_lane@single, found: ${listed//$'\n'/ }"
fi
checks=0
check() {
    local name="$1" lane="$2"
    shift 2
    step "sd_check.py local/$name lane $lane $*" \
        "$py" "$e2e/sd_check.py" --source "$work/src/$name" --mounted "$mnt/local/$name/latest/$lane" "$@"
    checks=$((checks + 1))
}
check tiny-sd "$default_lane"
check tiny-sd fp16 --variant fp16 --dtype float16
check tiny-sd-partial fp16 --variant fp16 --dtype float16
result="PASS — $checks lanes load with equal parameters, images and file SHA-256s (default $default_lane, fp16, fp16 with fallback)"
