#!/usr/bin/env bash
# Builds the Debian package: target/debian/tensorfs_<version>_<arch>.deb.
#
#   tools/package.sh [--no-build]
#
# The release binary (built unless --no-build), then from it the man pages (`tensorfs
# manpages`, gzipped as Debian installs them) and the bash, zsh and fish completions
# (`tensorfs completions SHELL`) into target/deb-assets/, then `cargo deb --no-build` with the
# assets Cargo.toml's [package.metadata.deb] lists. cargo-deb is installed once into
# ~/.cache/tensorfs-dev/cargo-deb when it is not on PATH.
set -euo pipefail
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CARGO_DEB_VERSION=3.8.0
build=1
for arg in "$@"; do
    case "$arg" in
        --no-build) build=0 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument $arg (see --help)" ;;
    esac
done

cd "$TENSORFS_ROOT"
ensure_cargo
if ! command -v cargo-deb >/dev/null 2>&1; then
    root="$TENSORFS_DEV_CACHE/cargo-deb"
    if [ ! -x "$root/bin/cargo-deb" ]; then
        log "installing cargo-deb $CARGO_DEB_VERSION into $root (once)"
        cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --root "$root" >&2 ||
            die "cargo install cargo-deb failed"
    fi
    export PATH="$root/bin:$PATH"
fi
[ $build = 0 ] || build_release
# The package's binary is the release build (cargo-deb finds target/release/ in CARGO_TARGET_DIR).
bin="$TENSORFS_BIN"
[ -x "$bin" ] || die "$bin is not built"
out="$TENSORFS_ROOT/target/deb-assets"
rm -rf "$out"
mkdir -p "$out/completions"
"$bin" manpages "$out/man" >/dev/null
gzip -9n "$out"/man/*.1
"$bin" completions bash >"$out/completions/tensorfs.bash"
"$bin" completions zsh >"$out/completions/_tensorfs"
"$bin" completions fish >"$out/completions/tensorfs.fish"
deb="$(cargo deb --no-build --strip 2>/dev/null | tail -1)"
[ -f "$deb" ] || die "cargo deb made no package ($deb)"
echo "$deb"
