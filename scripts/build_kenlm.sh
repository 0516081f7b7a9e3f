#!/usr/bin/env bash
# Builds KenLM's `lmplz` and `build_binary` from the kenlm source distribution on PyPI
# (needs cmake plus Debian's boost/eigen/zlib/bz2/lzma dev packages; `scripts/setup.sh --dev`
# installs them). Used by `shardscribe build-lm`.
#
#   bash scripts/build_kenlm.sh            # prints the bin directory when done
#
# Cached and idempotent: the binaries go to $SHARDSCRIBE_KENLM_DIR, else
# $SHARDSCRIBE_CACHE/kenlm, else $XDG_CACHE_HOME/shardscribe/kenlm, else ~/.cache/shardscribe/kenlm; a second run
# finds them and does nothing. pipeline/lm/build.py looks in the same place.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE_ROOT=${SHARDSCRIBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardscribe}
KENLM_DIR=${SHARDSCRIBE_KENLM_DIR:-$CACHE_ROOT/kenlm}
BIN_DIR=$KENLM_DIR/bin
if [ -x "$BIN_DIR/lmplz" ] && [ -x "$BIN_DIR/build_binary" ]; then
  echo "$BIN_DIR"
  exit 0
fi

PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
for tool in cmake make; do
  command -v "$tool" >/dev/null || { echo "build_kenlm.sh: $tool is missing (run: bash scripts/setup.sh --dev)" >&2; exit 1; }
done

mkdir -p "$KENLM_DIR"
WORK=$(mktemp -d "$KENLM_DIR/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# --no-binary kenlm only (not :all:, which would compile cmake itself from source);
# --no-build-isolation so pip does not try to fetch build requirements.
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary kenlm \
  --no-build-isolation -d "$WORK" kenlm >&2
SDIST=$(ls "$WORK"/kenlm-*.tar.gz | head -n 1)
tar -xzf "$SDIST" -C "$WORK"
SRC=$(find "$WORK" -mindepth 1 -maxdepth 1 -type d -name 'kenlm*' | head -n 1)
mkdir -p "$SRC/build"
( cd "$SRC/build" && cmake .. -DCMAKE_BUILD_TYPE=Release >&2 && make -j2 lmplz build_binary >&2 )
mkdir -p "$BIN_DIR.tmp"
cp "$SRC/build/bin/lmplz" "$SRC/build/bin/build_binary" "$BIN_DIR.tmp/"
rm -rf "$BIN_DIR"
mv "$BIN_DIR.tmp" "$BIN_DIR"
echo "$BIN_DIR"
