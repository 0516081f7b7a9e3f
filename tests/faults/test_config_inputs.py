"""Hostile and absurd configuration costs bounded time and memory and is refused in one
line before anything starts: a YAML alias bomb, resource numbers no machine has (in any
YAML number syntax), and ``--set`` values for string keys taken as written."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conftest import ROOT
from shardscribe.pipeline.config import ConfigError, load_config

SAMPLES = ROOT / "pipeline" / "assets" / "samples" / "samples.jsonl"

# Nine levels of nine-fold aliased mappings inside storage.options (a mapping of any
# shape): 9**9 (387 million) keys once walked, in under 1 KB.
BOMB = "storage:\n  options:\n    a0: &a0 {k0: x, k1: x, k2: x, k3: x, k4: x, k5: x, k6: x, k7: x, k8: x}\n" + "".join(
    f"    a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(9)) + "}\n" for i in range(1, 10))


# The CLI in a child that reports its own peak RSS (KiB) on its last stderr line: VmHWM,
# which starts afresh at exec (getrusage's ru_maxrss keeps the forking parent's peak).
CHILD = ("import sys; from shardscribe.jobs.cli import main; code = main(sys.argv[1:]); "
         "hwm = [ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0]; "
         "print('MAXRSS', hwm, file=sys.stderr); sys.exit(code)")


def _dry_run(tmp_path, *args):
    """(exit code, stderr lines without the RSS line, seconds, peak RSS in KiB)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", CHILD, "transcribe", "--input", str(SAMPLES),
                           "--output", str(tmp_path / "out"), "--dry-run", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    rss = int(lines.pop().split()[1]) if lines and lines[-1].startswith("MAXRSS") else None
    return proc.returncode, lines, time.monotonic() - started, rss


def test_an_alias_bomb_is_refused_in_one_line_at_once(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("extends: ar\n" + BOMB)
    assert len(bomb.read_bytes()) < 1000
    code, lines, seconds, peak_kb = _dry_run(tmp_path, "--config", str(bomb))
    assert code == 2, lines
    assert len(lines) == 1 and "aliases" in lines[0], lines
    assert seconds < 30 and peak_kb < 1_000_000      # KiB: far below the bomb's gigabytes
    assert not (tmp_path / "out").exists()


def test_an_alias_in_a_set_value_is_refused():
    with pytest.raises(ConfigError, match="aliases"):
        load_config("ar", ["storage.options=[&a [1, 2], *a, *a]"])


@pytest.mark.parametrize("override", ["ray.num_cpus=1000000000000", "ray.decode_actors=1000000000000",
                                      "ray.num_cpus=1e12", "ray.audio_actors=1.0e+12"])
def test_absurd_resource_numbers_fail_the_dry_run_before_ray_starts(tmp_path, override):
    code, lines, seconds, _ = _dry_run(tmp_path, "--config", "ar", "--set", override)
    assert code == 2, lines
    assert len(lines) == 1 and override.split("=")[0] in lines[0] and "local Ray instance" in lines[0], lines
    assert seconds < 60


def test_numbers_in_yaml_float_syntax_are_numbers():
    cfg = load_config("ar", ["audio.read_timeout_s=1e3", "batching.max_tokens=2.4e4", "ray.num_cpus=8"])
    assert (cfg.audio.read_timeout_s, cfg.batching.max_tokens, cfg.ray.num_cpus) == (1000.0, 24000, 8)
    with pytest.raises(ConfigError, match="batching.max_tokens: expected int"):
        load_config("ar", ["batching.max_tokens=2.5e-1"])


def test_a_string_key_takes_the_text_as_written():
    """YAML would read "Names: Anna Kowalski, Brno." as a mapping and "no" as false."""
    cfg = load_config("ar", ["model.initial_prompt=Names: Anna Kowalski, Brno.", "model.language=null"])
    assert cfg.model.initial_prompt == "Names: Anna Kowalski, Brno." and cfg.model.language is None
    assert load_config("ar", ["model.language=no"]).model.language == "no"
    assert load_config("ar", ["name=1.0"]).name == "1.0"
    # non-string keys still parse: booleans, numbers, lists
    cfg = load_config("ctc_beam", ["beam.key_phrases=[Anna, Brno]", "beam.native=false"])
    assert cfg.beam.key_phrases == ["Anna", "Brno"] and cfg.beam.native is False
