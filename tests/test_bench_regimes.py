"""`shardscribe bench regimes --quick`: the GPU regimes bench on toy sizes of the same
architectures, on the CPU, so it cannot rot while no GPU is lent. Besides the contract
keys, the run's own checks must hold: SSD's fallback from a verified prefix (seeded from
the verification pass's KV cache) continues exactly as full greedy AR does, on rows whose
draft was corrupted mid-way, on Whisper and on granite-speech; the CTC beam with LM and boosting gives another text than
greedy, and its native loop the eager loop's results; ALSD++ at beam 1 is greedy."""
from __future__ import annotations

import argparse
import json

from shardscribe.jobs.bench import regimes as bench_regimes


def test_quick_regimes_bench_runs_with_its_checks(tmp_path):
    parser = argparse.ArgumentParser()
    bench_regimes.add_arguments(parser)
    args = parser.parse_args(["--batch", "6", "--whisper-processor", str(tmp_path / "processor")])
    args.quick, args.device, args.out = True, "cpu", str(tmp_path / "r.json")
    result = bench_regimes.run(args)
    summary, rows = result["summary"], result["rows"]
    json.dumps(result, default=float)
    assert summary["device"] == "cpu" and summary["sizes"] == "toy"
    by = {(r["section"], r["regime"]): r for r in rows}
    for model in ("whisper toy", "granite-speech toy"):
        ha = by[(f"ssd {model}", "high_accuracy")]
        assert ha["verify_s"] > 0
        # Some rows were rejected and continued exactly as AR (None when none was). Not
        # fallback_s > 0: the fallback's time is a difference of two timings, which a toy
        # model's few steps can bring to 0 on a loaded machine (seen once in CI).
        assert ha["fallback_equals_ar"] == 1.0, model
        assert by[(f"ssd {model}", "high_rtfx")]["verify_s"] < ha["verify_s"]   # nearly every row gated
        # Pooled rows: the rejected rows of 8 and 32 batches in one fallback call, still AR's tokens.
        for n in (8, 32):
            pooled = by[(f"ssd {model}", f"high_accuracy, pooled x{n}")]
            assert pooled["fallback_rows"] == n * ha["fallback_rows"] > 0
            assert pooled["fallback_equals_ar"] == 1.0 and pooled["vs_ar"] > 0, (model, n)
            assert (f"ssd {model}", f"high_rtfx, pooled x{n}") in by
    for key in ("ssd_high_accuracy_vs_ar_whisper", "ssd_high_rtfx_vs_ar_granite", "ssd_high_accuracy_pooled8_vs_ar_whisper",
                "ssd_high_rtfx_pooled32_vs_ar_granite", "ctc_beam_eager_vs_greedy",
                "transducer_alsd4_vs_greedy"):
        assert summary[key] > 0, key
    assert summary["ctc_beam_native_equals_eager"] is True
    assert summary["ctc_beam_beam_differs_from_greedy"] is True
    assert summary["transducer_beam1_equals_greedy"] is True
    # Every loop's static path beside its eager one, with the same outputs (on the CPU: the
    # static buffers without capture; CUDA graphs on a GPU).
    for model in ("whisper toy", "granite-speech toy"):
        full = by[(f"ssd {model}", "full AR")]
        assert full["static_equals_eager"] == 1.0 and full["static_vs_eager"] > 0, model
        assert by[(f"ssd {model}", "high_accuracy")]["fallback_static_equals_eager"] is True, model
    for loop in ("greedy", "alsd4", "aes4"):
        assert summary[f"transducer_{loop}_static_equals_eager"] is True, loop
        assert summary[f"transducer_{loop}_static_decoder_over_eager"] > 0, loop
    assert (tmp_path / "r.png").is_file()
    # the processor written on the first run is what a machine without the embedded model reads
    assert (tmp_path / "processor" / "tokenizer.json").is_file()
    args.sections, args.ssd_models, args.out, args.pool = "ssd", "whisper", None, "4"
    again = bench_regimes.run(args)
    assert {(r["section"], r["regime"]) for r in again["rows"]} == {
        ("ssd whisper toy", "full AR"), ("ssd whisper toy", "high_accuracy"), ("ssd whisper toy", "high_rtfx"),
        ("ssd whisper toy", "high_accuracy, pooled x4"), ("ssd whisper toy", "high_rtfx, pooled x4")}
