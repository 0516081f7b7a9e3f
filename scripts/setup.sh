#!/usr/bin/env bash
# Installs shardscribe into ./.venv on a fresh Debian machine, offline from model hubs.
#
#   bash scripts/setup.sh          # runtime: libsndfile, a C compiler, CPU torch, the project
#   bash scripts/setup.sh --test   # + the lab: TTS engines, sox, chromium, the KenLM
#                                  #   toolchain and binaries, test/bench extras, pyctcdecode
#   bash scripts/setup.sh --dev    # the same as --test
#
# torch: we install the CPU build (torch==2.13.0, ~0.9 GB) on purpose. A bare
# `pip install torch` resolves to a ~5 GB CUDA build here; GPU users install their own
# CUDA torch into the venv first and this script keeps it (pip sees the range satisfied).
# Idempotent: every step checks before it works.
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_TEST=0
for arg in "$@"; do
  case "$arg" in
    --test|--dev) WITH_TEST=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

# System packages of the runtime: libsndfile for soundfile; gcc/libc6-dev for the beam
# search's native CPU frame loop (pipeline/decoding/ctc_beam/loop_native.c, compiled with
# the system cc on first use).
APT_PACKAGES=(gcc libc6-dev libsndfile1)
# The lab (tests, benchmarks, corpus and LM building): Debian's TTS engines and voices for
# the synthetic corpus (make-tts-corpus, make-bench-sets, the TTS tests); sox for audio
# checks; headless Chromium renders the job report (tests/test_report.py); g++, make,
# cmake, boost, eigen and the compression libraries compile KenLM's lmplz and build_binary
# (scripts/build_kenlm.sh below; `shardscribe build-lm` needs lmplz).
if [ "$WITH_TEST" = 1 ]; then
  APT_PACKAGES+=(espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts sox chromium
    g++ make cmake libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev
    libeigen3-dev zlib1g-dev libbz2-dev liblzma-dev)
fi
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing system packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" torch==2.13.0
if [ "$WITH_TEST" = 1 ]; then
  "${PIP[@]}" -e ".[test]"
  # pyctcdecode 0.5.0 pins numpy<2 but gives identical outputs on numpy 2; resolved with
  # its deps it would downgrade numpy to 1.x, which pyarrow (ray[data]) refuses to import
  # with. So --no-deps; its other dependency (pygtrie) comes with the test extra.
  .venv/bin/python -c "import pyctcdecode" 2>/dev/null || "${PIP[@]}" --no-deps pyctcdecode==0.5.0
else
  "${PIP[@]}" -e .
fi
if [ "$WITH_TEST" = 1 ] && [ -f scripts/build_kenlm.sh ]; then
  bash scripts/build_kenlm.sh
fi
echo "setup: done (.venv ready)"
