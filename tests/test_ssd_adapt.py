"""ssd.adapt on the real model and the bundled recordings: the first slice is plain AR, the
head is fitted on those transcripts in the model actor and drafts from then on (closer to
the decoder's text than the head it started from), the transcripts stay greedy AR's, and a
head left in the output folder is used at once by the next job."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

# The gate accepts nothing unverified (tau_ctc 0), so every row is greedy AR's text
# whichever head drafted it: the texts must equal `ar`'s.
COMMON = {"model.encoder_dtype": "float32", "batching.recordings_per_batch": 7, "ssd.tau_ctc": 0.0}


def _manifest(samples_dir, tmp_path, copies: int) -> str:
    lines = [json.loads(x) for x in (samples_dir / "samples.jsonl").read_text().splitlines()]
    path = tmp_path / "clips.jsonl"
    path.write_text("".join(json.dumps({"id": f"c{c}-{x['id']}", "audio": str(samples_dir / x["audio"])}) + "\n"
                            for c in range(copies) for x in lines))
    return str(path)


def _rows(dst) -> dict[str, dict]:
    return {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}


def _draft_cer(adapter, audios, texts, head_dir) -> float:
    from shardscribe.pipeline.metrics import corpus_cer
    from shardscribe.pipeline.models.whisper.ctc_head import load_ctc_head

    from shardscribe.pipeline.text import charset

    saved = adapter.ctc_head, adapter.ctc_decode
    try:
        adapter.ctc_head, adapter.ctc_decode = load_ctc_head(head_dir), charset.decode
        drafts = adapter.ctc_draft(adapter.encode(audios)).texts
    finally:
        adapter.ctc_head, adapter.ctc_decode = saved
    return corpus_cer(texts, drafts)


@pytest.mark.slow
def test_the_first_slice_is_ar_then_a_head_fitted_on_it_drafts(samples_dir, sample_audio, tmp_path, model_cache,
                                                                whisper_adapter):
    from shardscribe.jobs.api import transcribe

    from shardscribe.pipeline.models.whisper.ctc_head import embedded_head_dir

    manifest = _manifest(samples_dir, tmp_path, copies=2)
    common = {**COMMON, "model.cache_dir": str(model_cache)}
    # Greedy AR's text of one copy: each copy is one batch of the same 7 clips in the same
    # order, so AR gives every copy this text (c0-X, c1-X: the text of ar's c0-X).
    (tmp_path / "one").mkdir()
    one = _manifest(samples_dir, tmp_path / "one", copies=1)
    transcribe(one, str(tmp_path / "ar"), "ar", runner="local", set=common, progress_interval=0)
    # the slice: the first batch (7 clips, 28 s); fitted in at most a minute. Ten epochs
    # take the head's CER on these clips to ~0 (against 0.21 before), far past the 0.8x
    # asserted below, and end well inside the minute on a loaded 2-core machine.
    summary = transcribe(manifest, str(tmp_path / "adapt"), "ssd", runner="local", progress_interval=0,
                         set={**common, "ssd.adapt": True, "ssd.adapt_audio_minutes": 0.4,
                              "ssd.adapt_fit_minutes": 1.0, "ssd.adapt_epochs": 10})
    ar, ssd = _rows(tmp_path / "ar"), _rows(tmp_path / "adapt")
    assert len(ar) == 7 and {f"c{c}-{i[3:]}" for i in ar for c in (0, 1)} == set(ssd)
    assert summary["rows_out"] == len(ssd) == 14
    ar_text = {i: ar[f"c0-{i[3:]}"]["text"] for i in ssd}       # the AR text of each row's clip
    assert {i: r["text"] for i, r in ssd.items()} == ar_text
    first, later = [r for i, r in ssd.items() if i.startswith("c0-")], [r for i, r in ssd.items() if i.startswith("c1-")]
    assert {r["stage"] for r in first} == {"ar"}                       # the slice: plain AR
    assert "ar" not in {r["stage"] for r in later}                      # then drafted and verified
    head = tmp_path / "adapt" / "__shardscribe__" / "draft_head"
    card = json.loads((head / "config.json").read_text())
    assert card["adapted_on_segments"] == 7
    entry = summary["ssd_adapt"]
    assert entry["segments"] == 7 and entry["fitted_by_this_run"] is True
    # the fitted head drafts the decoder's own text better than the head it started from
    ids = sorted(sample_audio)
    audios, texts = [sample_audio[i] for i in ids], [ar[f"c0-{i}"]["text"] for i in ids]
    assert _draft_cer(whisper_adapter, audios, texts, head) < 0.8 * _draft_cer(whisper_adapter, audios, texts,
                                                                                 embedded_head_dir())

    # a second job given that folder drafts from its first batch (one batch, the 7 clips):
    # no slice, no fitting
    again = transcribe(one, str(tmp_path / "again"), "ssd", runner="local", progress_interval=0,
                       set={**common, "ssd.adapt": True, "ssd.adapt_dir": str(head)})
    rows = _rows(tmp_path / "again")
    assert len(rows) == 7 and "ar" not in {r["stage"] for r in rows.values()}
    assert {i: r["text"] for i, r in rows.items()} == {i: r["text"] for i, r in ar.items()}
    assert again["ssd_adapt"]["fitted_by_this_run"] is False


def test_adapt_is_refused_for_a_family_without_the_whisper_head():
    from shardscribe.pipeline.config import ConfigError, load_config
    from shardscribe.pipeline.kinds import decoder_kind

    granite = ["model.family=granite_speech", "model.source=/nonexistent", 'model.ctc_vocab=["<b>", "a"]']
    decoder_kind("ssd").check(load_config("ssd", granite))          # its own CTC drafts: fine
    with pytest.raises(ConfigError, match="ssd.adapt: fits the character CTC draft head of Whisper"):
        decoder_kind("ssd").check(load_config("ssd", granite + ["ssd.adapt=true"]))


def test_adapt_keys_are_validated_and_hashed_only_when_set():
    from shardscribe.pipeline.config import ConfigError, config_hash, load_config

    with pytest.raises(ConfigError, match="ssd.adapt_epochs"):
        load_config("ssd", ["ssd.adapt_epochs=0"])
    base = config_hash(load_config("ssd", []))
    assert config_hash(load_config("ssd", ["ssd.adapt_dir=/elsewhere"])) == base
    assert config_hash(load_config("ssd", ["ssd.adapt=true"])) != base
