#!/usr/bin/env bash
# Everything CI runs (README command 2; .ci/run calls this), on a clean Debian machine:
#
#   tools/test.sh [--no-cargo] [--no-e2e]
#
# 1. apt packages fuse3, attr and nginx (a static origin for tests/upload.rs) when missing;
#    s3s-fs (an S3 server for tests/upload.rs), built once into ~/.cache/tensorfs-dev;
# 2. the Python venv (tools/venv.sh, cached in ~/.cache/tensorfs-dev; TENSORFS_VENV=/path uses
#    an existing one), exported as TENSORFS_TEST_PYTHON for Rust tests that run Python clients;
# 3. cargo test --release (all targets, the Python package's native crate's unit tests, then
#    the GPU loader's tests with --features cuda, which check its "CUDA not available" error
#    on a machine without a GPU); the crate has no doc tests, so none are compiled. A test that finds a prerequisite missing records its skip
#    in target/tmp/skips.txt (under CI=true it fails instead, unless what is missing is a GPU),
#    and the summary lists the skips by name and count;
# 4. the end-to-end checks against the release binary and real FUSE mounts:
#    tools/package.sh and tools/package-test.sh (the Debian package built with cargo-deb,
#    installed with apt-get, its man page, bash completion and systemd units checked, a fstab
#    line mounted, an upgrade that keeps the mount, the units' command lines with readiness),
#    tools/unprivileged-test.sh (a user other than root, /dev/fuse 0666 as Debian ships it:
#    import, background mount, reads, status, allow_other refused then allowed, unmount),
#    tools/main-job.sh (all-MiniLM-L6-v2 imported, mounted, embeddings and SHA-256s equal),
#    tools/python-test.sh (the cozytensors wheel built with maturin, its pytest suite: every
#    tensor of a mounted file read from the blobs equal to safetensors' own, the fallbacks,
#    a damaged blob),
#    tools/e2e/diffusers_e2e.sh (tiny SD: default lane, fp16 lane, fp16 with fallback),
#    tools/e2e/hf_cache_e2e.sh (a huggingface_hub cache imported with --hf-cache, loaded by
#    repo id through MOUNT/@hf: Transformers, sentence-transformers, Diffusers with fp16),
#    tools/e2e/quantized_check.py (lanes written by `tensorfs quantize`: verified and decoded
#    equally by `tfs`, loaded by Transformers from `<lane>@decoded`),
#    tools/e2e/conventions_check.py (producer-quantized checkpoints of tests/data/conventions:
#    lanes byte-exact, `<lane>@decoded` loaded by Transformers, equal to the producer's reading
#    where bitsandbytes / compressed-tensors are installed),
#    tools/e2e/single_file_check.py (CompVis SD 1.x, SD 2.x, SDXL and SDXL refiner single
#    files, and UNets, text encoders and FLUX.1/SD3 transformers alone, imported as Diffusers
#    components: the file byte for byte, `<lane>@diffusers` loaded by Diffusers equal to the
#    model it was written from, diffusers' own conversion as oracle, ≤ 2 % added),
#    tools/e2e/joined_checkpoint_check.py (whole FLUX.1 and SD3-with-T5 checkpoints joined to a stored
#    pipeline with `import --pipeline`, and a FluxPipeline composed of separately imported
#    parts with `--component`: loaded by Diffusers equal to the models written),
#    tools/e2e/compat_check.py (stores of the reference `tfs` mounted by us; ours verified and
#    exported by `tfs`);
# 5. a smoke test of the benchmark command: `tools/bench --quick --no-drop-caches` (64 MiB, one
#    run, ~1 min): every section runs (gpu: or says "skipped: no GPU") and is in its JSON.
# Stops at the first failure, naming the step; a step past its time limit fails (the cargo
# tests: TENSORFS_CARGO_TEST_TIMEOUT_S, default 2700; each e2e script: TENSORFS_E2E_TIMEOUT_S,
# default 1200). Mounts are always unmounted (each script traps EXIT). Budget on 2 cores:
# release build ~9 min from clean, venv ~6 min from clean (cached afterwards), e2e ~3 min.
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

run_cargo=1
run_e2e=1
for arg in "$@"; do
    case "$arg" in
        --no-cargo) run_cargo=0 ;;
        --no-e2e) run_e2e=0 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument $arg (see --help)" ;;
    esac
done

work=""
passed=()
finish() {
    local rc=$?
    set +e
    mounts_cleanup
    if [ -n "$work" ]; then
        if [ $rc -eq 0 ]; then rm -rf "$work"; else log "scratch files kept in $work"; fi
    fi
    exit $rc
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cd "$TENSORFS_ROOT"
step "apt packages (fuse3, attr, nginx)" ensure_apt fuse3:fusermount3 attr:getfattr nginx:nginx
py="$("$TENSORFS_ROOT/tools/venv.sh")" || die "tools/venv.sh failed"
export TENSORFS_TEST_PYTHON="$py"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
log "TENSORFS_TEST_PYTHON=$py"
ensure_cargo
step "s3s-fs (the S3 server of tests/upload.rs)" ensure_s3s
log "TENSORFS_TEST_S3S=$TENSORFS_TEST_S3S"

# Time limits (seconds) so that a hung test fails with its name instead of eating CI's 90 min;
# `timeout` signals the whole process group (test binaries and mount daemons included).
cargo_limit="${TENSORFS_CARGO_TEST_TIMEOUT_S:-2700}"
skips="$TENSORFS_ROOT/target/tmp/skips.txt"
e2e_limit="${TENSORFS_E2E_TIMEOUT_S:-1200}"

if [ $run_cargo = 1 ]; then
    # Tests that find a prerequisite missing record it here (tests/skip/mod.rs).
    rm -f "$skips"
    step "cargo test --release --all-targets (limit ${cargo_limit} s)" \
        timeout -k 30 "$cargo_limit" cargo test --release --all-targets
    # The Python package's native crate (python/): its unit tests.
    step "cargo test --release -p cozytensors --lib" \
        timeout -k 30 "$cargo_limit" cargo test --release -p cozytensors --lib
    # The GPU loader's tests: without a GPU they check the "CUDA not available" error.
    step "cargo test --release --features cuda --test gpu" \
        timeout -k 30 "$cargo_limit" cargo test --release --features cuda --test gpu
fi

if [ $run_e2e = 1 ]; then
    step "cargo build --release" build_release
    step "Debian package (cargo deb; installed: man page, completion, units, fstab, upgrade)" \
        bash -c 'deb="$("$0"/tools/package.sh --no-build)" && timeout -k 30 "$1" "$0"/tools/package-test.sh "$deb"' \
        "$TENSORFS_ROOT" "$e2e_limit"
    step "a user other than root (import, mount, read, allow_other, unmount)" \
        timeout -k 30 "$e2e_limit" "$TENSORFS_ROOT/tools/unprivileged-test.sh"
    work="$(mktemp -d "${TMPDIR:-/tmp}/tensorfs-test.XXXXXX")"
    step "main job (all-MiniLM-L6-v2 through the mount)" timeout -k 30 "$e2e_limit" "$TENSORFS_ROOT/tools/main-job.sh"
    passed+=("main job")
    step "python package cozytensors (maturin wheel; pytest on real mounts)" \
        timeout -k 30 "$e2e_limit" "$TENSORFS_ROOT/tools/python-test.sh"
    passed+=("python package")
    step "diffusers e2e (tiny SD lanes through the mount)" \
        timeout -k 30 "$e2e_limit" "$TENSORFS_ROOT/tools/e2e/diffusers_e2e.sh"
    passed+=("diffusers e2e")
    step "hub cache e2e (import --hf-cache; loads by repo id through @hf)" \
        timeout -k 30 "$e2e_limit" "$TENSORFS_ROOT/tools/e2e/hf_cache_e2e.sh"
    passed+=("hub cache e2e")
    step "quantized lanes (tensorfs quantize, decoded view, reference decode)" \
        timeout -k 30 "$e2e_limit" "$py" "$TENSORFS_ROOT/tools/e2e/quantized_check.py" --tensorfs "$TENSORFS_BIN" --work "$work/quantized"
    passed+=("quantized")
    step "producer conventions (quantized checkpoints imported, decoded views loaded)" \
        timeout -k 30 "$e2e_limit" "$py" "$TENSORFS_ROOT/tools/e2e/conventions_check.py" --tensorfs "$TENSORFS_BIN" --work "$work/conventions"
    passed+=("conventions")
    step "single-file checkpoints (converted to Diffusers components; diffusers as oracle)" \
        timeout -k 30 "$e2e_limit" "$py" "$TENSORFS_ROOT/tools/e2e/single_file_check.py" --tensorfs "$TENSORFS_BIN" --work "$work/single_file"
    passed+=("single files")
    step "whole FLUX.1 and SD3 checkpoints with T5 (joined to a stored pipeline; diffusers as oracle)" \
        timeout -k 30 "$e2e_limit" "$py" "$TENSORFS_ROOT/tools/e2e/joined_checkpoint_check.py" --tensorfs "$TENSORFS_BIN" --work "$work/joined_checkpoint"
    passed+=("joined checkpoints")
    step "compat_check (reference tfs 0.17.2)" \
        timeout -k 30 "$e2e_limit" "$py" "$TENSORFS_ROOT/tools/e2e/compat_check.py" --tensorfs "$TENSORFS_BIN" --work "$work/compat"
    passed+=("compat")
    step "tools/bench --quick (every benchmark section runs once, small)" \
        timeout -k 30 "$e2e_limit" "$TENSORFS_ROOT/tools/bench" --quick --no-drop-caches --json "$work/bench.json"
    step "tools/bench JSON has every section" "$py" - "$work/bench.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
want = ["io", "import", "read", "mmap", "safe_open", "python", "views", "single_file", "rss", "decode", "gpu"]
sections = report["sections"]
bad = [s for s in want if sections.get(s, {}).get("status") != "ran"
       and not (s == "gpu" and sections.get(s, {}).get("reason", "").startswith("skipped: no GPU"))]
empty = [s for s in want if sections.get(s, {}).get("status") == "ran"
         and not any(r["section"] == s and r["ours"] is not None for r in report["rows"])]
if bad or empty or sorted(sections) != sorted(want):
    sys.exit(f"bench JSON: sections not run: {bad}; without a measured row: {empty}; present: {sorted(sections)}")
print(f"bench JSON: {len(report['rows'])} rows, sections {', '.join(want)}")
PY
    passed+=("bench")
    echo "e2e: ${#passed[@]} passed, 0 failed"
fi
report_skips() {
    if [ -s "$skips" ]; then
        local n
        n=$(wc -l <"$skips")
        if [ "$n" = 1 ]; then log "1 test skipped:"; else log "$n tests skipped:"; fi
        sed 's/^/    skipped: /' "$skips" >&2
    else
        log "0 tests skipped"
    fi
}
[ $run_cargo = 1 ] && report_skips
log "all green"
