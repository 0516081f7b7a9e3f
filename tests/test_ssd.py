"""Self-speculative decoding invariants (seed 000), exact, on real audio and the real model."""
from __future__ import annotations

import math

import pytest
import torch

from pipeline.decoding.ar_greedy import greedy_decode
from pipeline.decoding.ssd import AR_FALLBACK, CTC_GATE, LLM_VERIFY, SelfSpeculativeDecoder
from pipeline.decoding.ssd_verify import verify_drafts


@pytest.fixture(scope="module")
def encoded(whisper_adapter, sample_audio):
    audios = [sample_audio[k] for k in sorted(sample_audio)]
    enc = whisper_adapter.encode(audios)
    full = greedy_decode(whisper_adapter, enc.states)
    return enc, full


def _reference_token_probs(adapter, states, tokens):
    """Token probabilities by plain incremental decoding, one row at a time (no padding)."""
    probs = []
    seq = list(adapter.prompt_ids)
    for k, tok in enumerate(tokens + [adapter.eot_id]):
        hidden, _ = adapter.decoder_hidden(torch.tensor([seq]), states, None, None, None)
        logits = adapter.logits(hidden[:, -1])[0]
        logits[adapter.suppress_mask] = -math.inf
        if k == 0:
            logits[adapter.begin_suppress_ids] = -math.inf
        probs.append(logits.softmax(-1)[tok].item())
        seq.append(tok)
    return probs


def test_verification_matches_incremental_decoding(whisper_adapter, encoded):
    enc, full = encoded
    ver = verify_drafts(whisper_adapter, enc.states, full, tau_slm=0.0)
    assert ver.accepted.all()  # the AR output is the decoder's own greedy choice
    for i in (0, 3):
        ref = _reference_token_probs(whisper_adapter, enc.states[i:i + 1], full[i])
        got = ver.token_probs[i, :len(full[i])].tolist()
        assert got == pytest.approx(ref[:-1], abs=1e-4)


def test_batch_verification_equals_rows_alone(whisper_adapter, encoded):
    enc, full = encoded
    drafts = [f[:max(1, len(f) - i)] for i, f in enumerate(full)]  # ragged, some incomplete
    batch = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm=0.3)
    for i, d in enumerate(drafts):
        one = verify_drafts(whisper_adapter, enc.states[i:i + 1], [d], tau_slm=0.3)
        assert bool(one.accepted[0]) == bool(batch.accepted[i])
        assert int(one.first_reject[0]) == int(batch.first_reject[i])
        assert one.token_probs[0, :len(d)].tolist() == pytest.approx(batch.token_probs[i, :len(d)].tolist(), abs=1e-5)


def test_incomplete_draft_is_not_accepted(whisper_adapter, encoded):
    enc, full = encoded
    drafts = [f[:-2] for f in full]
    ver = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm=0.0)
    assert not ver.accepted.any()
    assert ver.first_reject.tolist() == [len(d) for d in drafts]


def _texts(adapter, full):
    return [adapter.text(f) for f in full]


def test_tau_ctc_infinite_returns_the_ctc_drafts(whisper_adapter, encoded):
    enc, full = encoded
    drafts = ["some draft", "Another one.", "x", "Fourth draft text", "five", "six!"]
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=math.inf, tau_slm=0.5)
    rows = ssd.decode(enc.states, drafts, torch.rand(len(drafts)) * 10)
    assert [r.text for r in rows] == [d.strip() for d in drafts]
    assert all(r.stage == CTC_GATE for r in rows)


def test_tau_zero_and_slm_one_is_exactly_full_ar(whisper_adapter, encoded):
    enc, full = encoded
    drafts = _texts(whisper_adapter, full)  # even perfect drafts must be re-decoded
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=1.0)
    rows = ssd.decode(enc.states, drafts, torch.zeros(len(drafts)))
    assert all(r.stage == AR_FALLBACK and r.prefix == [] for r in rows)
    assert [r.tokens for r in rows] == full


def test_fallback_resumes_from_the_verified_prefix(whisper_adapter, encoded):
    enc, full = encoded
    # Corrupt one token of each AR transcript: verification must stop there, and the
    # fallback must reproduce AR forced with the verified prefix (here: AR itself).
    js = [min(2, len(f) - 1) for f in full]
    bad_tok = whisper_adapter.tokenize("zebra")[0]
    corrupted = [f[:j] + [bad_tok] + f[j + 1:] for f, j in zip(full, js)]
    drafts = [whisper_adapter.text(c) for c in corrupted]
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=0.01)
    rows = ssd.decode(enc.states, drafts, torch.zeros(len(drafts)))
    for row, f, c in zip(rows, full, corrupted):
        assert row.stage == AR_FALLBACK
        j = len(row.prefix)
        assert row.draft_tokens[:j] == row.prefix
        forced = greedy_decode(whisper_adapter, enc.states[rows.index(row):rows.index(row) + 1],
                               prefixes=[row.prefix])[0]
        assert row.tokens == row.prefix + forced
    assert [r.tokens for r in rows] == full


def test_good_drafts_are_verified_not_regenerated(whisper_adapter, encoded):
    enc, full = encoded
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=0.0)
    rows = ssd.decode(enc.states, _texts(whisper_adapter, full), torch.zeros(len(full)))
    assert all(r.stage == LLM_VERIFY and r.generated == 0 for r in rows)
    assert [r.tokens for r in rows] == full
