"""granite-speech behind the SSD decoders, on a tiny random model built here.

The same SSD code that serves Whisper (pipeline.decoding.ssd: decoder, verify; ar_greedy)
must serve granite-speech. The references are independent of our adapter and decoders:
transformers' own GraniteSpeechForConditionalGeneration.forward on each utterance alone,
with its own input_features path (encoder, projector, audio-token merge), re-run over the
whole sequence at every step (no cache, no padding), logits divided by logits_scaling.
"""
from __future__ import annotations

import math

import pytest
import torch

from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
from shardscribe.pipeline.decoding.drafting.drafters import CTCLookahead
from shardscribe.pipeline.decoding.ssd.decoder import AR_FALLBACK, CTC_GATE, LLM_VERIFY, SelfSpeculativeDecoder
from shardscribe.pipeline.decoding.ssd.verify import verify_drafts
from shardscribe.pipeline.models.granite_speech.adapter import GraniteSpeechAdapter, pad_states, split_states

SPECIALS = ["<|end_of_text|>", "<|audio|>", "<|start_of_role|>", "<|end_of_role|>", "<unk>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz .,'?\n")
CTC_VOCAB = ["<blank>"] + CHARS[:-1]   # CTC id 0 is blank, then characters
AUDIO_ID, EOT_ID = 1, 0
LM_VOCAB_PADDING = 3                   # LM rows beyond the tokenizer, as real checkpoints have
FEATURE_DIM = 16
FRAMES = [50, 31, 14, 44]              # -> 12, 9, 3, 9 audio embeddings (3 per 15 frames)
MAX_NEW = 10
CHAT_TEMPLATE = ("{% for m in messages %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>"
                 "{{ m['content'] }}<|end_of_text|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}")


def _tokenizer(chat_template: str | None = CHAT_TEMPLATE):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + CHARS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIALS[EOT_ID], unk_token="<unk>",
                                 pad_token=SPECIALS[EOT_ID])
    hf.chat_template = chat_template
    return hf


def _model(tokenizer):
    from transformers import GraniteSpeechConfig, GraniteSpeechForConditionalGeneration

    cfg = GraniteSpeechConfig(
        text_config=dict(model_type="granite", vocab_size=len(tokenizer) + LM_VOCAB_PADDING, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2,
                         max_position_embeddings=256, logits_scaling=4.0, embedding_multiplier=2.0,
                         residual_multiplier=0.5, attention_multiplier=1.0,
                         eos_token_id=EOT_ID, bos_token_id=EOT_ID, pad_token_id=EOT_ID),
        encoder_config=dict(input_dim=FEATURE_DIM, num_layers=2, hidden_dim=32, num_heads=2,
                            output_dim=len(CTC_VOCAB), context_size=20, max_pos_emb=32, conv_kernel_size=5,
                            dropout=0.0),
        projector_config=dict(model_type="blip_2_qformer", hidden_size=32, num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=64, encoder_hidden_size=32,
                              cross_attention_frequency=1),
        audio_token_index=AUDIO_ID, has_lora_adapter=False, downsample_rate=5, window_size=15,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = GraniteSpeechForConditionalGeneration(cfg).eval()
    # transformers' init (std 0.02) gives a near-uniform LM that ignores the audio: widen
    # it, with sharp attention and a peaked head; end-of-text scores 1.1x 'p', so rows end.
    gains = {"q_proj": 3.0, "k_proj": 3.0, "lm_head": 8.0}
    with torch.no_grad():
        for name, w in model.named_parameters():
            if w.dim() == 2:
                gain = next((g for key, g in gains.items() if key in name), 1.0)
                w.normal_(0.0, 1.0 if "embed" in name else gain * w.shape[1] ** -0.5)
        model.lm_head.weight[EOT_ID] = 1.1 * model.lm_head.weight[tokenizer.convert_tokens_to_ids("p")]
    return model


def _features() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(t, FEATURE_DIM, generator=g) for t in FRAMES]


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    tok = _tokenizer()
    model = _model(tok)
    adapter = GraniteSpeechAdapter(model, tok, CTC_VOCAB)
    feats = _features()
    # Each utterance encoded alone (as the references see it), then batched the way the
    # pipeline re-batches CPU-offloaded rows: trimmed to their valid embeddings, zero-padded.
    rows = []
    for f in feats:
        enc = adapter.encode_features(f[None])
        rows.append(enc.states[0, :int(enc.valid_frames[0])])
    states = pad_states(rows)
    prompts = [_reference_prompt(tok, model, f) for f in feats]
    full = [_reference_ar(model, f, p, [], MAX_NEW)[0] for f, p in zip(feats, prompts)]
    return dict(tok=tok, model=model, adapter=adapter, feats=feats, states=states, prompts=prompts, full=full)


def _reference_prompt(tok, model, features) -> list[int]:
    """The processor's way: chat template with one audio token, expanded to the number of
    projector outputs transformers computes for this utterance."""
    n = model.get_audio_features(features[None]).pooler_output.shape[1]
    text = tok.apply_chat_template([{"role": "user", "content": "<|audio|>can you transcribe the speech "
                                                                "into a written format?"}],
                                   tokenize=False, add_generation_prompt=True)
    return tok(text.replace("<|audio|>", "<|audio|>" * n), add_special_tokens=False).input_ids


def _suppressed_logits(model, features, seq) -> torch.Tensor:
    """transformers' forward on one utterance alone, last position, / logits_scaling,
    with the tokens greedy decoding never emits (specials but end-of-text, LM vocab
    padding) removed."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq]), input_features=features[None]).logits[0, -1]
    logits = logits / model.config.text_config.logits_scaling
    logits[[i for i in range(len(SPECIALS)) if i != EOT_ID]] = -math.inf
    logits[-LM_VOCAB_PADDING:] = -math.inf
    return logits


def _reference_ar(model, features, prompt, prefix, max_new) -> tuple[list[int], list[float]]:
    """Plain greedy AR after prompt+prefix; returns the tokens and their probabilities."""
    seq, out, probs = list(prompt) + list(prefix), [], []
    for _ in range(max_new):
        p = _suppressed_logits(model, features, seq).softmax(-1)
        tok = int(p.argmax())
        if tok == EOT_ID:
            break
        out.append(tok)
        probs.append(float(p[tok]))
        seq.append(tok)
    return out, probs


def _reference_token_probs(model, features, prompt, draft) -> list[float]:
    """p(draft_k | prompt, draft_<k) and p(eot | prompt, draft), one forward per position."""
    seq, probs = list(prompt), []
    for tok in list(draft) + [EOT_ID]:
        probs.append(float(_suppressed_logits(model, features, seq).softmax(-1)[tok]))
        seq.append(tok)
    return probs


# --- the adapter against transformers' own model ----------------------------------------

def test_prompt_is_the_chat_template_with_one_audio_token_per_embedding(setup):
    ad = setup["adapter"]
    assert ad.batch_prompts(setup["states"]) == setup["prompts"]
    # Without a chat template the explicit granite format gives the same ids here.
    plain = GraniteSpeechAdapter(setup["model"], _tokenizer(chat_template=None), CTC_VOCAB)
    assert plain.batch_prompts(setup["states"]) == setup["prompts"]


def test_batched_audio_embeddings_match_transformers_masked_merge(setup):
    ad, model, feats = setup["adapter"], setup["model"], setup["feats"]
    T = max(FRAMES)
    padded = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, T - len(f))) for f in feats])
    enc = ad.encode_features(padded, torch.tensor(FRAMES))
    # The reference: each clip alone, unpadded (the conformer takes no mask, so a padded
    # batch would change a shorter clip's states).
    with torch.no_grad():
        theirs = [model.get_audio_features(f[None]).pooler_output[0] for f in feats]
    # GraniteSpeechFeatureExtractor's input_features_mask: 3 embeddings per started 15 frames.
    counts = [math.ceil(t / 15) * 3 for t in FRAMES]
    embeds, valid = split_states(enc.states)
    assert valid.sum(1).tolist() == counts == enc.valid_frames.tolist()
    for b, n in enumerate(counts):
        assert theirs[b].shape[0] == n
        torch.testing.assert_close(embeds[b, :n], theirs[b], rtol=0, atol=1e-6)


def test_logits_are_divided_by_logits_scaling(setup):
    ad, model, f, prompt = setup["adapter"], setup["model"], setup["feats"][0], setup["prompts"][0]
    assert ad.logits_scaling == 4.0
    ids = torch.tensor([prompt])
    hidden, _ = ad.decoder_hidden(ids, setup["states"][:1], None, None, None)
    with torch.no_grad():
        theirs = model(input_ids=ids, input_features=f[None]).logits
    torch.testing.assert_close(ad.logits(hidden), theirs / 4.0, rtol=0, atol=1e-5)
    assert not torch.allclose(ad.logits(hidden), theirs, atol=1e-3)


def test_ctc_draft_is_greedy_ctc_over_the_encoder_out_head(setup):
    ad, model, feats = setup["adapter"], setup["model"], setup["feats"]
    T = max(FRAMES)
    padded = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, T - len(f))) for f in feats])
    draft = ad.ctc_draft(ad.encode_features(padded, torch.tensor(FRAMES)))
    for b, t in enumerate(FRAMES):
        with torch.no_grad():     # each clip alone, unpadded
            logp = model.model.encoder.out(model.model.encoder(feats[b][None]).last_hidden_state)[0].log_softmax(-1)
        path, prev, text = logp[:t].argmax(-1).tolist(), 0, ""
        for a in path:  # collapse repeats, then drop blanks
            if a != prev and a != 0:
                text += CTC_VOCAB[a]
            prev = a
        entropy = -(logp[:t].exp() * logp[:t]).sum(-1)
        assert draft.texts[b] == text
        assert float(draft.max_entropy[b]) == pytest.approx(float(entropy.max()), abs=1e-5)
    assert any(draft.texts)


def test_encode_counts_audio_embeddings_like_the_feature_extractor(setup):
    from types import SimpleNamespace

    from transformers import GraniteSpeechFeatureExtractor

    lengths = [16000, 12345, 3200, 161]
    # Its mel front end needs torchaudio (not installed); its count of projector outputs
    # per utterance does not, so it is called on a plain namespace.
    fe = SimpleNamespace(melspec_kwargs={"hop_length": 160}, projector_window_size=15,
                         projector_downsample_rate=5)
    counts = GraniteSpeechFeatureExtractor._get_num_audio_features(fe, lengths)

    def features_stand_in(audios, device="cpu"):  # the padded batch's stacked log-mels
        frames = (max(len(a) for a in audios) // 160 + 1) // 2
        return {"input_features": torch.randn(len(audios), frames, FEATURE_DIM)}

    ad = GraniteSpeechAdapter(setup["model"], setup["tok"], CTC_VOCAB, feature_extractor=features_stand_in)
    enc = ad.encode([torch.zeros(n).numpy() for n in lengths])
    assert enc.valid_frames.tolist() == counts
    assert ad.batch_prompts(enc.states) == [ad.prompt_head + [AUDIO_ID] * n + ad.prompt_tail for n in counts]
    with pytest.raises(ValueError, match="feature extractor"):
        setup["adapter"].encode([torch.zeros(1600).numpy()])


def test_loads_a_saved_checkpoint(setup, tmp_path):
    from shardscribe.pipeline.models.granite_speech.adapter import load_granite_adapter

    setup["model"].save_pretrained(tmp_path)
    setup["tok"].save_pretrained(tmp_path)
    from shardscribe.pipeline.models.granite_speech.features import GraniteFeatures

    loaded = load_granite_adapter(str(tmp_path), CTC_VOCAB)
    # torchaudio does not import with the CPU torch build: the plain-torch features stand in.
    assert isinstance(loaded.feature_extractor, GraniteFeatures)
    assert greedy_decode(loaded, setup["states"], max_new_tokens=MAX_NEW) == setup["full"]


def test_v4_module_layout_gives_the_same_decoder(setup):
    model = setup["model"]
    v4 = torch.nn.Module()  # transformers v4: encoder/projector on the model, LM with its own head
    v4.encoder, v4.projector = model.model.encoder, model.model.projector
    v4.language_model = torch.nn.Module()
    v4.language_model.model, v4.language_model.lm_head = model.model.language_model, model.lm_head
    v4.config, v4.generation_config = model.config, model.generation_config
    old = GraniteSpeechAdapter(v4, setup["tok"], CTC_VOCAB)
    states = setup["states"]
    assert greedy_decode(old, states, max_new_tokens=MAX_NEW) == setup["full"]


# --- the SSD invariants, with the same decoder code Whisper uses ---------------------------

def test_full_ar_equals_transformers_greedy(setup):
    got = greedy_decode(setup["adapter"], setup["states"], max_new_tokens=MAX_NEW)
    assert got == setup["full"]
    assert any(len(f) < MAX_NEW for f in setup["full"])  # some rows really end with end-of-text


def test_tau_ctc_infinite_returns_the_greedy_ctc_text(setup):
    ad = setup["adapter"]
    T = max(FRAMES)
    padded = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, T - len(f))) for f in setup["feats"]])
    enc = ad.encode_features(padded, torch.tensor(FRAMES))
    draft = ad.ctc_draft(enc)
    rows = SelfSpeculativeDecoder(ad, tau_ctc=math.inf, tau_slm=0.5, max_new_tokens=MAX_NEW).decode(
        enc.states, draft.texts, draft.max_entropy)
    assert all(t.strip() for t in draft.texts)
    assert [(r.stage, r.text) for r in rows] == [(CTC_GATE, t.strip()) for t in draft.texts]


def test_tau_zero_and_slm_one_is_exactly_full_ar(setup):
    ad = setup["adapter"]
    drafts = [ad.text(f) or "a" for f in setup["full"]]  # even perfect drafts are re-decoded
    ssd = SelfSpeculativeDecoder(ad, tau_ctc=0.0, tau_slm=1.0, max_new_tokens=MAX_NEW)
    rows = ssd.decode(setup["states"], drafts, torch.zeros(len(drafts)))
    assert all(r.stage == AR_FALLBACK and r.prefix == [] for r in rows)
    assert [r.tokens for r in rows] == setup["full"]


def test_fallback_from_prefix_j_equals_ar_forced_with_that_prefix(setup):
    ad, model, feats = setup["adapter"], setup["model"], setup["feats"]
    full, prompts = setup["full"], setup["prompts"]
    bad = ad.tokenize("q")[0]
    # A draft that agrees with AR up to j, then a token AR did not choose, then junk.
    js = [min(2, max(len(f) - 1, 0)) for f in full]
    drafts = [f[:j] + [bad if (f[j:j + 1] or [None])[0] != bad else ad.tokenize("z")[0]] + ad.tokenize("xyz")
              for f, j in zip(full, js)]
    ref_probs = [_reference_token_probs(model, x, p, d) for x, p, d in zip(feats, prompts, drafts)]
    # tau between the worst AR-agreeing token and the best wrong one: verification stops at j.
    agree = min(min(p[:j], default=1.0) for p, j in zip(ref_probs, js))
    wrong = max(p[j] for p, j in zip(ref_probs, js))
    assert wrong < agree
    ssd = SelfSpeculativeDecoder(ad, tau_ctc=0.0, tau_slm=(agree + wrong) / 2, max_new_tokens=MAX_NEW)
    rows = ssd.decode(setup["states"], [ad.text(d) for d in drafts], torch.zeros(len(drafts)))
    for row, x, p, d, j in zip(rows, feats, prompts, drafts, js):
        assert row.stage == AR_FALLBACK and row.draft_tokens == d and row.prefix == d[:j]
        forced, _ = _reference_ar(model, x, p, row.prefix, MAX_NEW)
        assert row.tokens == row.prefix + forced
    assert any(j > 0 for j in js)


def test_verification_matches_teacher_forcing_and_batch_equals_rows_alone(setup):
    ad, model, states = setup["adapter"], setup["model"], setup["states"]
    full = setup["full"]
    drafts = [f[:max(1, len(f) - i)] for i, f in enumerate(full)]  # ragged, some incomplete
    batch = verify_drafts(ad, states, drafts, tau_slm=0.05)
    for i, d in enumerate(drafts):
        ref = _reference_token_probs(model, setup["feats"][i], setup["prompts"][i], d)
        assert batch.token_probs[i, :len(d)].tolist() == pytest.approx(ref[:-1], abs=1e-5)
        n = int(split_states(states[i:i + 1])[1].sum())
        for alone_states in (states[i:i + 1], states[i:i + 1, :n]):  # padded or trimmed row
            one = verify_drafts(ad, alone_states, [d], tau_slm=0.05)
            assert bool(one.accepted[0]) == bool(batch.accepted[i])
            assert int(one.first_reject[0]) == int(batch.first_reject[i])
            alone = one.token_probs[0, :len(d)].tolist()
            assert alone == pytest.approx(batch.token_probs[i, :len(d)].tolist(), abs=1e-5)


def test_complete_ar_drafts_are_verified_not_regenerated(setup):
    ad, full = setup["adapter"], setup["full"]
    ended = [i for i, f in enumerate(full) if 0 < len(f) < MAX_NEW]
    assert ended
    ssd = SelfSpeculativeDecoder(ad, tau_ctc=0.0, tau_slm=0.0, max_new_tokens=MAX_NEW)
    rows = ssd.decode(setup["states"][ended], [ad.text(full[i]) for i in ended], torch.zeros(len(ended)))
    assert all(r.stage == LLM_VERIFY and r.generated == 0 for r in rows)
    assert [r.tokens for r in rows] == [full[i] for i in ended]


def test_gate_verification_serves_granite_unchanged(setup):
    """ssd.gate_verify_tau on a decoder-only model: complete AR drafts pass it and stay
    final from the gate; truncated ones fail eq. 5's end-of-text check and are decoded
    exactly as with a closed gate."""
    ad, full = setup["adapter"], setup["full"]
    ended = [i for i, f in enumerate(full) if 1 < len(f) < MAX_NEW]
    assert ended
    drafts = [ad.text(full[i]) if n % 2 == 0 else ad.text(full[i][:-1]) for n, i in enumerate(ended)]
    states = setup["states"][ended]
    zeros = torch.zeros(len(ended))
    got = SelfSpeculativeDecoder(ad, tau_ctc=math.inf, tau_slm=0.5, max_new_tokens=MAX_NEW,
                                 gate_verify_tau=0.0).decode(states, drafts, zeros)
    closed = SelfSpeculativeDecoder(ad, tau_ctc=0.0, tau_slm=0.5, max_new_tokens=MAX_NEW).decode(states, drafts, zeros)
    for n, (g, c) in enumerate(zip(got, closed)):
        if n % 2 == 0:
            assert g.stage == CTC_GATE and g.text == drafts[n] and g.min_prob is not None
        else:
            assert (g.stage, g.tokens, g.prefix) == (c.stage, c.tokens, c.prefix)


def test_speculative_rounds_serve_granite_unchanged(setup):
    """The fallback's greedy speculative rounds (ssd.lookahead) on a decoder-only cache give
    plain greedy decoding, for the decoder's own output and for a damaged copy of it."""
    ad, full = setup["adapter"], setup["full"]
    damaged = [[t for k, t in enumerate(f) if k % 3 != 1] + ad.tokenize("xyz") for f in full]
    for drafts in (full, damaged):
        got = greedy_decode(ad, setup["states"], max_new_tokens=MAX_NEW, drafter=CTCLookahead(drafts, lookahead=3))
        assert got == full
    prefixes = [f[:1] for f in full]
    plain = greedy_decode(ad, setup["states"], prefixes=prefixes, max_new_tokens=MAX_NEW)
    got = greedy_decode(ad, setup["states"], prefixes=prefixes, max_new_tokens=MAX_NEW,
                        drafter=CTCLookahead(damaged, [1] * len(full), 3))
    assert got == plain
