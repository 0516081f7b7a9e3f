"""The decoders as pipeline stages: SSD as two Ray actor pools (encode+gate+verify, then
AR fallback on CPU-offloaded encoder states), greedy CTC, and CTC beam search."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import torch

from conftest import ROOT
from shardscribe.pipeline.output import SUMMARY_NAME


@pytest.fixture(scope="module")
def varied_manifest(tmp_path_factory, samples_dir, sample_manifest):
    """Bundled clips plus noisy copies, so drafts range from confident to doubtful."""
    from shardscribe.pipeline.audio import decode_audio

    root = tmp_path_factory.mktemp("varied")
    rng = np.random.default_rng(0)
    lines = []
    for m in sample_manifest:
        lines.append({"id": m["id"], "audio": str(samples_dir / m["audio"]), "text": m["text"]})
        audio = decode_audio((samples_dir / m["audio"]).read_bytes())[0]
        for snr_db in (10, 3):
            noise = rng.standard_normal(len(audio)).astype(np.float32)
            noise *= np.sqrt((audio ** 2).mean() / 10 ** (snr_db / 10)) / noise.std()
            path = root / f"{m['id']}_snr{snr_db}.wav"
            sf.write(path, audio + noise, 16000)
            lines.append({"id": path.stem, "audio": str(path), "text": m["text"]})
    manifest = root / "varied.jsonl"
    manifest.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return manifest, lines


def _midpoint_between(values, q):
    """A threshold strictly between two distinct sorted values near quantile q."""
    vals = sorted(set(round(v, 4) for v in values))
    assert len(vals) >= 2, vals
    i = min(max(1, int(q * len(vals))), len(vals) - 1)
    return (vals[i - 1] + vals[i]) / 2


def test_ssd_two_pool_ray_plan_takes_all_three_stages(ssd_adapter, varied_manifest, tmp_path, model_cache):
    from shardscribe.pipeline.audio import decode_audio
    from shardscribe.pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder

    manifest, lines = varied_manifest
    audios = [decode_audio(open(x["audio"], "rb").read())[0] for x in lines]
    enc = ssd_adapter.encode(audios)
    draft = ssd_adapter.ctc_draft(enc)
    # Thresholds from the data: gate some rows, verify some, fall back on the rest.
    tau_ctc = _midpoint_between(draft.max_entropy.tolist(), 0.3)
    probe = SelfSpeculativeDecoder(ssd_adapter, tau_ctc, 0.0).first_pass(enc.states, draft.texts, draft.max_entropy)
    # With tau_slm=0 the rows marked llm_verify are those whose draft ends where the decoder
    # would; put tau_slm just below the best of them, so it passes and weaker ones fall back.
    verified = [r.min_prob for r in probe if r.stage == "llm_verify"]
    assert verified, [r.stage for r in probe]
    best = max(verified)
    lower = [r.min_prob for r in probe if r.stage != "ctc_gate" and r.min_prob is not None and r.min_prob < best]
    tau_slm = (best + max(lower)) / 2 if lower else best / 2
    expected = SelfSpeculativeDecoder(ssd_adapter, tau_ctc, tau_slm).decode(enc.states, draft.texts,
                                                                            draft.max_entropy)
    stages = {r.stage for r in expected}
    assert stages == {"ctc_gate", "llm_verify", "ar_fallback"}, (tau_ctc, tau_slm, [r.stage for r in expected])

    dst = tmp_path / "ssd"
    proc = subprocess.run(
        [sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(manifest), "--output", str(dst),
         "--config", "ssd", "--set", f"ssd.tau_ctc={tau_ctc}", "--set", f"ssd.tau_slm={tau_slm}",
         "--set", f"model.cache_dir={model_cache}", "--set", "batching.recordings_per_batch=4",
         "--set", "model.encoder_dtype=float32", "--set", "model.quantize=none",  # ssd_adapter's model,
         "--set", "ssd.adaptive_verify=false"],   # whose entropies set tau_ctc; every batch drafts
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}
    assert len(rows) == len(lines)
    for line, exp in zip(lines, expected):
        seg = rows[line["id"]]["segments"][0]
        assert seg["stage"] == exp.stage, line["id"]
        assert seg["text"] == exp.text, line["id"]
        if exp.stage == "ar_fallback":
            assert seg["prefix_len"] == len(exp.prefix) and seg["generated"] == exp.generated
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == len(lines) and summary["errors"] == 0
    assert set(summary["stages"]) == {"ctc_gate", "llm_verify", "ar_fallback"}


def test_ctc_greedy_and_beam_configs_run_in_process(ssd_adapter, samples_dir, tmp_path, model_cache):
    from shardscribe.pipeline.config import load_config
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.sources import read_source

    rows = read_source(str(samples_dir / "samples.jsonl"))
    cache = f"model.cache_dir={model_cache}"
    out = {}
    for name, extra in [("ctc_greedy", []), ("ctc_beam", ["beam.size=1", "beam.flop_top_n=null",
                                                          "beam.flop_ratio=null", "beam.prune_threshold=null"])]:
        dst = tmp_path / name
        run_local(rows, load_config(name, [cache] + extra), str(dst), progress=False)
        out[name] = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}
    assert all(r["stage"] == "ctc_greedy" for r in out["ctc_greedy"].values())
    assert all(r["stage"] == "beam" for r in out["ctc_beam"].values())
    # Beam 1 without LM or pruning is the greedy path.
    assert {k: r["text"] for k, r in out["ctc_beam"].items()} == {k: r["text"] for k, r in out["ctc_greedy"].items()}


def test_ssd_fallback_starts_from_the_verification_cache_in_and_across_processes(varied_manifest, model_cache):
    """In-process (local runner, GPU machine) the fallback takes the first stage's whole
    verification KV cache by handle, and, where the rows never become a table between the
    stages (the local runner), each pending row's encoder states as a tensor, never packed;
    packed into a table after all, those states travel as float32 arrays.
    A fallback pool with its own model (the Ray plan)
    receives the cropped self-attention K/V and next token in the rows. Both give exactly
    the rows of reuse off, and so does that pool with greedy speculative rounds
    (ssd.lookahead) over the drafts that travel in the rows, and behind a packed gate that
    gates nothing (ssd.pack_gate with tau_ctc 0)."""
    from shardscribe.actors.audio_prep import AudioPrep
    from shardscribe.actors.finisher import Finisher
    from shardscribe.actors.transcriber import Transcriber
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.kinds.ssd.stages import SSDPending
    from shardscribe.pipeline.records import INPUT_SCHEMA, table
    from shardscribe.pipeline.sources import read_source

    manifest, lines = varied_manifest
    rows = read_source(str(manifest))[:9]
    out = {}
    for mode in ("in_process", "in_process_objects", "shipped", "shipped_lookahead", "shipped_pack_gate", "off"):
        cfg = load_config("ssd", [f"model.cache_dir={model_cache}", "ssd.tau_ctc=0.0", "ssd.tau_slm=0.5",
                                  "ssd.adaptive_verify=false",
                                  f"ssd.reuse_kv={str(mode != 'off').lower()}", "batching.max_tokens=9000",
                                  f"ssd.lookahead={4 if mode == 'shipped_lookahead' else 0}",
                                  f"ssd.pack_gate={str(mode == 'shipped_pack_gate').lower()}"])
        prep, first = AudioPrep(cfg.to_dict()), Transcriber(cfg.to_dict())
        second = Finisher(cfg.to_dict(), first_stage=first.decoder if mode.startswith("in_process") else None)
        if mode == "in_process_objects":
            mid = first.rows(prep(table(rows, INPUT_SCHEMA)), pending_as_bytes=False)
            pending = [p for r in mid for p in r["pending_state"]]
            assert all(isinstance(p.states, torch.Tensor) for p in pending)
        else:
            mid = first(prep(table(rows, INPUT_SCHEMA)))
            pending = [SSDPending.from_bytes(b) for bs in mid.column("pending_state").to_pylist() for b in bs]
            assert all(isinstance(p.states, np.ndarray) and p.states.dtype == np.float32 for p in pending)
        handles = [p.handle for p in pending]
        shapes = [list(p.kv.shape) if p.kv is not None else [] for p in pending]
        nexts = [p.next_token for p in pending if p.next_token is not None]
        # The drafts travel with the pending rows (the fallback pool's speculative rounds read them).
        assert all(p.draft for p in pending)
        result = (second.finish_rows(mid) if mode == "in_process_objects" else second(mid)).to_pylist()
        out[mode] = [[(s["stage"], s["text"], s["prefix_len"], s["generated"]) for s in r["segments"]]
                     for r in result]
        assert len(handles) == len(shapes) > 0
        if mode.startswith("in_process"):
            assert all(handles) and not any(shapes) and len(set(handles)) == len(handles)
            assert not first.decoder.seeds.take(handles[0])  # every kept seed was consumed
            assert second.stage.seeded == len(handles)
        elif mode.startswith("shipped"):
            # [decoder layers, K|V, heads, prompt + prefix, head dim], small next to the states
            assert not any(handles) and all(len(sh) == 5 and sh[:3] == [4, 2, 6] for sh in shapes)
            assert len(nexts) == len(shapes) and all(t >= 0 for t in nexts) and second.stage.seeded == len(shapes)
        else:
            assert not any(handles) and not any(shapes) and second.stage.seeded == 0
    stages = {seg[0] for r in out["off"] for seg in r}
    assert "ar_fallback" in stages, stages
    assert out["in_process"] == out["in_process_objects"] == out["off"] and out["shipped"] == out["off"]
    # Greedy-rule speculative rounds over the shipped drafts give the plain fallback's rows.
    assert out["shipped_lookahead"] == out["off"]
    # The packed gate with tau_ctc 0 gates nothing: every clip is encoded again alone and
    # its states travel to the fallback pool, so the rows are the unpacked ones.
    assert out["shipped_pack_gate"] == out["off"]


def test_per_row_key_phrases_reach_the_beam_pool(samples_dir, tmp_path, model_cache):
    """A row's own key phrases cross from the model pool to the beam pool with its pending
    segments (they used to be dropped there): the same clip, boosted in one row only, is
    spelt as the phrase in that row alone."""
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config

    clip = str(samples_dir / "fox_flite_slt.flac")
    phrase = "quick brown fox jumps over the lazy dog"
    rows = [{"id": "plain", "audio": clip}, {"id": "boosted", "audio": clip, "key_phrases": [phrase]}]
    cfg = load_config("ctc_beam", [f"model.cache_dir={model_cache}", "decoder.pack_windows=false",
                                   "beam.alpha_boost=1.0"])
    run_local(rows, cfg, str(tmp_path), progress=False)
    out = {r["id"]: r["text"] for r in pq.read_table(sorted(str(p) for p in tmp_path.glob("*.parquet"))).to_pylist()}
    assert phrase in out["boosted"]
    assert phrase not in out["plain"]
