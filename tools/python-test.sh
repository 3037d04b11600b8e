#!/usr/bin/env bash
# The cozytensors Python package (python/): builds its abi3 wheel with maturin, installs it
# into the venv of tools/venv.sh, and runs its pytest suite on real mounts with the release
# binary ($TENSORFS_BIN). tools/test.sh runs it after the release build.
#
#   tools/python-test.sh [PYTEST ARGS…]
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

py="$("$TENSORFS_ROOT/tools/venv.sh")" || die "tools/venv.sh failed"
bin="$(dirname "$py")"
wheels="${CARGO_TARGET_DIR:-$TENSORFS_ROOT/target}/wheels"
[ -x "$TENSORFS_BIN" ] || die "no release binary at $TENSORFS_BIN (cargo build --release)"
rm -f "$wheels"/cozytensors-*.whl
(cd "$TENSORFS_ROOT/python" && "$bin/maturin" build --release --strip -i "$py" -o "$wheels" >&2)
"$py" -m pip install --quiet --no-deps --force-reinstall "$wheels"/cozytensors-*.whl
# From a scratch folder, so `import cozytensors` is the installed wheel, not the source tree.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/cozytensors-test.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
TENSORFS_BIN="$TENSORFS_BIN" "$py" -m pytest -q -p no:cacheprovider --import-mode=importlib \
    --basetemp "$scratch/tmp" "$TENSORFS_ROOT/python/tests" "$@"
