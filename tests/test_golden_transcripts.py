"""Golden transcripts: every shipped config (conf/*.yaml), on the bundled samples and 40
held-out clips (20 held-out voices, 20 held-out texts of the synthetic corpus, rendered by
`shardscribe make-bench-sets --heldout 20`), must give the text committed in
tests/golden/transcripts.json. `ssd` runs at both presets and `ctc_beam` also with an LM
and key phrases; `ctc_model_greedy` and `ctc_model_beam` run the ctc family's embedded
model (the Whisper encoder with the shipped CTC head: the repo ships no transformers CTC
checkpoint, so none has golden text), the transducer configs the embedded TDT transducer.
A config added to conf/ without a case here fails test_every_shipped_config_has_a_case.

The configs put the same clips through the same float32 encoder in the same micro-batches,
and the encoder's fixed 30-s window dominates this module's time. So each distinct
micro-batch is encoded once (`shared_encoder_windows`, keyed by its exact bytes and the
encoder's weights), and a config that hands the same encoder the same bytes again gets the
states computed for them. A config that batched differently, or another model, misses and
runs the encoder itself; the test of the memo below checks that it returns what the
encoder returns.

    .venv/bin/python tests/test_golden_transcripts.py --write NAME ...   # regenerate these cases
    .venv/bin/python tests/test_golden_transcripts.py --write            # regenerate every case

Regenerate on purpose only, and only the cases whose new text is intended: the file is what
makes a behaviour change show.
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

# The float32 model: model.encoder_dtype=auto and model.quantize=auto would make the texts
# depend on the CPU. The keys are Whisper's; the embedded transducer runs its Whisper
# encoder in float32 anyway.
F32 = "model.encoder_dtype=float32"
NO_INT8 = "model.quantize=none"
# SSD drafts every batch: with ssd.adaptive_verify on, which batches draft depends on timing.
EVERY_DRAFT = "ssd.adaptive_verify=false"

# (name, config, overrides); "{lm}" is replaced by an LM built from tests/golden/lm_text.txt.
CONFIGS = [
    ("ar", "ar", [F32, NO_INT8]),
    ("ctc_greedy", "ctc_greedy", [F32, NO_INT8]),
    ("ssd_high_accuracy", "ssd", [F32, NO_INT8, EVERY_DRAFT]),
    ("ssd_high_rtfx", "ssd", [F32, NO_INT8, EVERY_DRAFT, "ssd.preset=high_rtfx"]),
    ("ctc_beam", "ctc_beam", [F32, NO_INT8]),
    ("ctc_beam_lm_boost", "ctc_beam", [F32, NO_INT8, "beam.lm_path={lm}", f"beam.key_phrases={json.dumps(KEY_PHRASES)}"]),
    ("default", "default", [F32, NO_INT8, EVERY_DRAFT]),
    ("ctc_model_greedy", "ctc_model_greedy", [F32, NO_INT8]),
    ("ctc_model_beam", "ctc_model_beam", [F32, NO_INT8]),
    ("transducer_greedy", "transducer_greedy", []),
    ("transducer_beam", "transducer_beam", []),
]


def manifest_rows() -> list[dict]:
    from shardscribe.pipeline.sources import read_source

    rows = []
    for path in (ROOT / "pipeline" / "assets" / "samples" / "samples.jsonl", GOLDEN / "heldout.jsonl"):
        rows += read_source(str(path))
    return rows


def build_lm(out_dir: Path) -> Path:
    subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "build-lm", "--text", str(GOLDEN / "lm_text.txt"),
                    "--order", "4", "--output", str(out_dir)], cwd=ROOT, check=True, capture_output=True)
    return out_dir


def transcribe(config: str, overrides: list[str], rows: list[dict], dst: Path, cache: Path) -> dict[str, str]:
    from shardscribe.pipeline.config import load_config
    from shardscribe.actors.local_runner import run_local

    cfg = load_config(config, overrides + [f"model.cache_dir={cache}"])
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
    from shardscribe.pipeline.models.whisper.adapter import WhisperAdapter

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


def golden_run(tmp: Path, names: list[str] | None = None) -> dict[str, dict[str, str]]:
    """The transcripts of the named cases (all of them by default)."""
    cases = [c for c in CONFIGS if names is None or c[0] in names]
    rows = manifest_rows()
    lm = build_lm(tmp / "lm") if any("{lm}" in o for c in cases for o in c[2]) else None
    results = {}
    with shared_encoder_windows():
        for name, config, overrides in cases:
            sets = [o.replace("{lm}", str(lm)) for o in overrides]
            results[name] = transcribe(config, sets, rows, tmp / name, tmp / "cache")
    return results


@pytest.fixture(scope="module")
def golden_results(tmp_path_factory):
    return golden_run(tmp_path_factory.mktemp("golden"))


def test_shared_windows_return_what_the_encoder_returns(ssd_adapter, samples_dir, sample_manifest):
    from shardscribe.pipeline.audio import decode_audio

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


def test_every_shipped_config_has_a_case():
    from shardscribe.pipeline.config import shipped_configs

    assert set(shipped_configs()) == {config for _, config, _ in CONFIGS}


@pytest.mark.parametrize("name", [c[0] for c in CONFIGS])
def test_transcripts_match_golden(golden_results, name):
    expected = json.loads((GOLDEN / "transcripts.json").read_text())[name]
    got = golden_results[name]
    assert len(expected) == 47
    assert got == expected


if __name__ == "__main__":
    known = [c[0] for c in CONFIGS]
    if sys.argv[1:2] != ["--write"] or not set(sys.argv[2:]) <= set(known):
        sys.exit(f"{__doc__}\ncases: {' '.join(known)}")
    names = sys.argv[2:] or None
    with tempfile.TemporaryDirectory() as tmp:
        results = golden_run(Path(tmp), names)
    path = GOLDEN / "transcripts.json"
    kept = json.loads(path.read_text()) if names else {}
    path.write_text(json.dumps(kept | results, indent=1, sort_keys=True) + "\n")
