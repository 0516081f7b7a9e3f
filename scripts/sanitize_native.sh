#!/usr/bin/env bash
# Runs tests against the native CTC frame loop (pipeline/decoding/ctc_beam/loop_native.c)
# built with AddressSanitizer and UndefinedBehaviorSanitizer: an out-of-bounds read or
# write, a use after free or undefined behaviour aborts the run with the sanitizer's report.
# The library comes from ctypes inside an unsanitized Python, so the sanitizer runtimes are
# preloaded; Python's own allocations are not checked for leaks.
#
#   bash scripts/sanitize_native.sh                      # tests/test_beam_native.py
#   bash scripts/sanitize_native.sh tests/test_beam_*.py # any tests
set -euo pipefail
cd "$(dirname "$0")/.."
cc="${CC:-gcc}"
asan="$("$cc" -print-file-name=libasan.so)"
ubsan="$("$cc" -print-file-name=libubsan.so)"
for lib in "$asan" "$ubsan"; do
  [[ -f "$lib" ]] || { echo "sanitize_native.sh: $cc has no $(basename "$lib")" >&2; exit 2; }
done
tests=("$@")
[[ ${#tests[@]} -gt 0 ]] || tests=(tests/test_beam_native.py)
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 LD_PRELOAD="$asan $ubsan" PYTHONPATH="scripts${PYTHONPATH:+:$PYTHONPATH}" \
  .venv/bin/python -m pytest -q -n 0 --capture=sys -p sanitize_native_plugin "${tests[@]}"
