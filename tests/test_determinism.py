"""A clip's transcript is its own: the same clip, batched with different neighbours, in a
different order and batch size (as a resume or a retried block would batch it), gives the
same text under ctc_greedy with isolated window packing (``decoder.pack_windows``, several
clips per encoder pass under a block-diagonal attention mask; ctc_beam's encoder path is
the same) and under ssd's high_rtfx preset, which no longer gates on shared windows. Both
fail with shared-window packing (the layout before isolation, which ``ssd.pack_gate=true
ssd.adaptive_pack_gate=false`` still uses): these clips then change text with their
neighbours."""
from __future__ import annotations

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def prepared(samples_dir):
    """Four bundled samples and three held-out clips, decoded and segmented once."""
    from shardscribe.actors.audio_prep import AudioPrep
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.records import INPUT_SCHEMA, prepared_rows, table
    from shardscribe.pipeline.sources import read_source

    rows = (read_source(str(samples_dir / "samples.jsonl"))[:4]
            + read_source(str(ROOT / "tests" / "golden" / "heldout.jsonl"))[:3])
    prep = AudioPrep(load_config("ctc_greedy").to_dict())
    return prepared_rows(prep(table(rows, INPUT_SCHEMA)))


def texts(rows: list[dict], batch: int, first, second, cfg) -> dict[str, str]:
    """The in-process model stages over ``rows`` in batches of ``batch`` rows."""
    from shardscribe.pipeline.segment_runner import complete_pending, transcribe_prepared

    out = {}
    for i in range(0, len(rows), batch):
        done = transcribe_prepared([dict(r) for r in rows[i:i + batch]], first, cfg.batching.max_tokens)
        if second is not None:
            done = complete_pending(done, second, cfg.batching.max_tokens)
        out.update({r["id"]: r["text"] for r in done})
    return out


@pytest.mark.parametrize("config,overrides", [("ctc_greedy", ["decoder.pack_windows=true"]),
                                              ("ssd", ["ssd.preset=high_rtfx", "ssd.adaptive_verify=false"])])
def test_same_clip_same_text_in_any_batch(config, overrides, prepared, ssd_adapter):
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.kinds import decoder_kind

    cfg = load_config(config, overrides)
    kind = decoder_kind(cfg.decoder.kind)
    first = kind.build_first_stage(ssd_adapter, cfg)
    second = kind.build_second_stage(cfg, first) if kind.two_stage else None
    samples = prepared[:4]
    alone = texts(samples, 4, first, second, cfg)
    # Reversed, interleaved with other clips, three to a batch: every sample has new
    # neighbours in its batch (and would have in a packed window).
    mixed = [r for pair in zip(samples[::-1], prepared[4:] + [None]) for r in pair if r is not None]
    beside = texts(mixed, 3, first, second, cfg)
    assert all(alone.values()) and len(alone) == 4
    assert {k: beside[k] for k in alone} == alone


