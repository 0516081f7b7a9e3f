"""Golden transcripts: every shipped decoder config, on the bundled samples and 40 held-out
clips (20 held-out voices, 20 held-out texts of the synthetic corpus, rendered by
`shardscribe make-bench-sets --heldout 20`), must give the text committed in
tests/golden/transcripts.json. The file was written by this module's ``--write`` before the
architecture change (model families and decoder kinds as registries), so any behaviour
change in the restructured code shows here.

The six configs put the same clips through the same float32 encoder in the same
micro-batches, and the encoder's fixed 30-s window dominated this module's time
(docs/testing.md). So each distinct micro-batch is encoded once (`shared_encoder_windows`,
keyed by its exact bytes and the encoder's weights), and a config that hands the same
encoder the same bytes again gets the states computed for them. A config that batched
differently, or another model, misses and runs the encoder itself; the test of the memo
below checks that it returns what the encoder returns.

    .venv/bin/python tests/test_golden_transcripts.py --write   # regenerate (on purpose only)
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
KEY_PHRASES = ["tripped breaker", "forklift", "warehouse", "pressure", "kilograms"]

# (name, config, overrides); "{lm}" is replaced by an LM built from tests/golden/lm_text.txt.
CONFIGS = [
    ("ar", "ar", []),
    ("ctc_greedy", "ctc_greedy", []),
    ("ssd_high_accuracy", "ssd", []),
    ("ssd_high_rtfx", "ssd", ["ssd.preset=high_rtfx"]),
    ("ctc_beam", "ctc_beam", []),
    ("ctc_beam_lm_boost", "ctc_beam", ["beam.lm_path={lm}", f"beam.key_phrases={json.dumps(KEY_PHRASES)}"]),
]


def manifest_rows() -> list[dict]:
    from pipeline.sources import read_source

    rows = []
    for path in (ROOT / "pipeline" / "assets" / "samples" / "samples.jsonl", GOLDEN / "heldout.jsonl"):
        rows += read_source(str(path))
    return rows


def build_lm(out_dir: Path) -> Path:
    subprocess.run([sys.executable, "-m", "jobs.cli", "build-lm", "--text", str(GOLDEN / "lm_text.txt"),
                    "--order", "4", "--output", str(out_dir)], cwd=ROOT, check=True, capture_output=True)
    return out_dir


def transcribe(config: str, overrides: list[str], rows: list[dict], dst: Path, cache: Path) -> dict[str, str]:
    from pipeline.config import load_config
    from actors.local_runner import run_local

    # The float32 encoder: model.encoder_dtype=auto would make the texts depend on the CPU.
    cfg = load_config(config, overrides + [f"model.cache_dir={cache}", "model.encoder_dtype=float32"])
    run_local(rows, cfg, str(dst), progress=False)
    table = pq.read_table(sorted(str(p) for p in dst.glob("*.parquet")), columns=["id", "text", "error"])
    out = {}
    for r in table.to_pylist():
        assert r["error"] is None, (config, r)
        out[r["id"]] = r["text"]
    return out


@contextlib.contextmanager
def shared_encoder_windows():
    """Within the block, WhisperAdapter.run_encoder encodes each distinct micro-batch of
    log-mel windows once: the key is the slice's bytes, dtype, shape and device, the
    encoder's weights and module types, and the thread count; the encoder's own code runs
    on every miss, one micro-batch at a time as run_encoder does. Yields the counts of hits
    and misses."""
    from pipeline.models.whisper.adapter import WhisperAdapter

    original = WhisperAdapter.run_encoder
    memo: dict[tuple, object] = {}
    counts = {"hits": 0, "misses": 0}
    encoders: dict[int, tuple] = {}

    def run_encoder(self, features):
        encoder = self.model.model.encoder
        if id(encoder) not in encoders:    # the model itself: its weights and module types
            digest = hashlib.sha1()
            for name, module in encoder.named_modules():
                digest.update(f"{name}:{type(module).__name__};".encode())
            for t in encoder.parameters():
                digest.update(_raw_bytes(t))
            encoders[id(encoder)] = (digest.hexdigest(), encoder)   # held: ids stay unique
        step = self.encoder_micro_batch or features.shape[0]
        out = []
        for i in range(0, features.shape[0], step):
            part = features[i:i + step].contiguous()
            key = (encoders[id(encoder)][0], str(part.device), torch.get_num_threads(), str(part.dtype),
                   tuple(part.shape), str(self.dtype), hashlib.sha1(_raw_bytes(part)).hexdigest())
            if key in memo:
                counts["hits"] += 1
            else:
                counts["misses"] += 1
                memo[key] = original(self, part)
            out.append(memo[key])
        return out[0] if len(out) == 1 else torch.cat(out)

    WhisperAdapter.run_encoder = run_encoder
    try:
        yield counts
    finally:
        WhisperAdapter.run_encoder = original


def _raw_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()


def golden_run(tmp: Path) -> dict[str, dict[str, str]]:
    rows = manifest_rows()
    lm = build_lm(tmp / "lm")
    results = {}
    with shared_encoder_windows():
        for name, config, overrides in CONFIGS:
            sets = [o.replace("{lm}", str(lm)) for o in overrides]
            results[name] = transcribe(config, sets, rows, tmp / name, tmp / "cache")
    return results


@pytest.fixture(scope="module")
def golden_results(tmp_path_factory):
    return golden_run(tmp_path_factory.mktemp("golden"))


def test_shared_windows_return_what_the_encoder_returns(ssd_adapter, samples_dir, sample_manifest):
    from pipeline.audio import decode_audio

    audios = [decode_audio((samples_dir / m["audio"]).read_bytes())[0] for m in sample_manifest[:3]]
    features = ssd_adapter.features(audios)
    ssd_adapter.encoder_micro_batch = 2     # slices [0:2] [2:3]; the shifted batch: [1:3]
    other = copy.deepcopy(ssd_adapter)      # another model: one weight moved
    with torch.inference_mode():
        other.model.model.encoder.conv1.weight.mul_(1.01)
        plain, plain_shifted = ssd_adapter.run_encoder(features), ssd_adapter.run_encoder(features[1:])
        plain_other = other.run_encoder(features)
        with shared_encoder_windows() as counts:
            first = ssd_adapter.run_encoder(features)
            again = ssd_adapter.run_encoder(features)
            shifted = ssd_adapter.run_encoder(features[1:])
            from_other = other.run_encoder(features)
    assert torch.equal(first, plain) and torch.equal(again, plain) and torch.equal(shifted, plain_shifted)
    assert torch.equal(from_other, plain_other) and not torch.equal(plain_other, plain)
    assert counts == {"misses": 5, "hits": 2}


@pytest.mark.parametrize("name", [c[0] for c in CONFIGS])
def test_transcripts_match_golden(golden_results, name):
    expected = json.loads((GOLDEN / "transcripts.json").read_text())[name]
    got = golden_results[name]
    assert len(expected) == 47
    assert got == expected


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        results = golden_run(Path(tmp))
    (GOLDEN / "transcripts.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
