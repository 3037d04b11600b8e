#!/usr/bin/env bash
# The checks that need a CUDA device, on a machine with an NVIDIA GPU, its driver, /dev/fuse
# and a CUDA build of torch (CI has no GPU: tools/test.sh runs the same tests, which then check
# the "CUDA not available" answers and skip the device ones by name):
#
#   tools/gpu-test.sh [--bench]
#
# 1. the GPU loader's Rust tests: cargo test --release --features cuda --test gpu, or the test
#    binary $TENSORFS_GPU_TEST_BIN built elsewhere (cargo test --release --features cuda --test
#    gpu --no-run);
# 2. python/tests/test_cuda.py with the cozytensors wheel: built with maturin, or the wheel
#    $COZYTENSORS_WHEEL installed into a scratch folder for this python ($PYTHON, else python3);
#    TENSORFS_REQUIRE_GPU=1 makes a missing device a failure instead of a skip;
# 3. with --bench: tools/bench --only gpu --no-build (1 GiB, 3 runs).
#
# Every step runs, and the script fails at the end if one failed. The release binary is
# $TENSORFS_BIN (else target/release/tensorfs).
set -uo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench=0
for arg in "$@"; do
    case "$arg" in
        --bench) bench=1 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument $arg (see --help)" ;;
    esac
done

py="${PYTHON:-python3}"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/tensorfs-gpu.XXXXXX")"
leftovers() {
    # A mount a test left behind is a failure of that test; detach it so the scratch goes.
    local m
    for m in $(awk -v s="$scratch" '$3 ~ /^fuse/ && index($2, s) == 1 {print $2}' /proc/mounts); do
        log "error: a test left $m mounted; detaching it"
        umount -l "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
    done
}
trap 'mounts_cleanup; leftovers; rm -rf "$scratch"' EXIT
failed=()
check() {
    local name="$1"
    shift
    echo "==> $_tool: $name" >&2
    local start=$SECONDS
    if "$@"; then
        echo "==> $_tool: ok: $name ($((SECONDS - start)) s)" >&2
    else
        echo "==> $_tool: FAILED: $name ($((SECONDS - start)) s)" >&2
        failed+=("$name")
    fi
}

export TENSORFS_REQUIRE_GPU=1
"$py" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"; print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)' \
    || die "no CUDA device for torch ($py)"
[ -x "$TENSORFS_BIN" ] || die "no release binary at $TENSORFS_BIN (cargo build --release)"

if [ -n "${TENSORFS_GPU_TEST_BIN:-}" ]; then
    check "GPU loader (Rust, $TENSORFS_GPU_TEST_BIN)" "$TENSORFS_GPU_TEST_BIN" --test-threads 1
else
    ensure_cargo
    check "GPU loader (Rust)" cargo test --release --features cuda --test gpu -- --test-threads 1
fi

if [ -n "${COZYTENSORS_WHEEL:-}" ]; then
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --target "$scratch/site" "$COZYTENSORS_WHEEL" \
        || die "installing $COZYTENSORS_WHEEL failed"
    export PYTHONPATH="$scratch/site${PYTHONPATH:+:$PYTHONPATH}"
else
    (cd "$TENSORFS_ROOT/python" && maturin build --release --strip -i "$py" -o "$scratch/wheels" >&2) \
        || die "maturin build failed"
    "$py" -m pip install --quiet --no-deps --force-reinstall "$scratch"/wheels/cozytensors-*.whl
fi
# From the scratch folder, so `import cozytensors` is the installed wheel.
check "python/tests/test_cuda.py" bash -c 'cd "$1" && TENSORFS_BIN="$2" "$3" -m pytest -q -p no:cacheprovider \
    --import-mode=importlib --basetemp "$1/tmp" "$4/python/tests/test_cuda.py"' _ \
    "$scratch" "$TENSORFS_BIN" "$py" "$TENSORFS_ROOT"

if [ $bench = 1 ]; then
    check "tools/bench --only gpu" "$py" "$TENSORFS_ROOT/tools/bench" --only gpu --no-build --work "$scratch"
fi

if [ ${#failed[@]} -gt 0 ]; then
    die "failed: ${failed[*]}"
fi
log "all GPU checks passed"
