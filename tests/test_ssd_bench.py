"""`shardscribe bench ssd --quick` end to end on the bundled samples (real Whisper, real
CTC head): every contract key is a number, the ratios are the rows' own, greedy
speculative rounds change no transcript, and the WER-vs-RTFx plot is written. No timing
is asserted."""
from __future__ import annotations

import json


def test_quick_ssd_bench_runs_end_to_end_with_the_contract_keys(tmp_path, capsys, model_cache):
    from shardscribe.jobs.cli import main

    out = tmp_path / "ssd.json"
    assert main(["bench", "ssd", "--quick", "--sweep", "0.3,6.0", "--lookahead", "4", "--threads", "1",
                 "--set", f"model.cache_dir={model_cache}", "--out", str(out)]) == 0
    assert "summary:" in capsys.readouterr().out
    result = json.loads(out.read_text())
    s, rows = result["summary"], {r["config"]: r for r in result["rows"]}
    for key in ("ar_wer", "ar_rtfx", "ctc_greedy_rtfx", "high_rtfx_wer", "high_rtfx_rtfx", "high_accuracy_wer",
                "high_accuracy_rtfx", "pct_ctc_gated", "pct_llm_verified"):
        assert isinstance(s[key], (int, float)), key
    assert s["high_rtfx_share_of_ceiling"] == rows["SSD high_rtfx"]["rtfx"] / rows["CTC greedy"]["rtfx"]
    for name in ("high_accuracy", "high_rtfx"):
        base, greedy = rows[f"SSD {name}"], rows[f"SSD {name}, lookahead 4 greedy"]
        assert greedy["wer"] == base["wer"] and greedy["pct_F"] == base["pct_F"]
        assert s[f"{name}_lookahead_greedy_speedup"] == greedy["rtfx"] / base["rtfx"]
        if base["pct_F"]:
            assert greedy["tokens_per_pass"] >= 1.0
    # The packed gate rows: the pipeline's decoder with high_rtfx's thresholds, unpacked
    # gate = the shared-encoder "SSD high_rtfx" row's transcripts; the ratios are the rows' own.
    on, off = rows["SSD high_rtfx, pipeline, packed gate"], rows["SSD high_rtfx, pipeline, unpacked gate"]
    assert off["wer"] == rows["SSD high_rtfx"]["wer"] and off["pct_C"] == rows["SSD high_rtfx"]["pct_C"]
    assert s["high_rtfx_packed_gate_speedup"] == on["rtfx"] / off["rtfx"]
    assert s["high_rtfx_packed_gate_share_of_packed_ceiling"] == on["rtfx"] / s["ctc_greedy_packed_rtfx"]
    assert s["high_rtfx_packed_gate_wer"] == on["wer"] and on["pct_C"] == s["high_rtfx_packed_gate_pct_ctc_gated"]
    assert out.with_suffix(".png").stat().st_size > 10_000
