"""Tiny random Whisper checkpoints for tests, built offline.

No multilingual tokenizer can be downloaded here, so the "multilingual" checkpoints use
the embedded tiny.en tokenizer (pipeline.models.whisper.loader), whose added tokens
already hold Whisper's full special set in the English-only layout: <|endoftext|> 50256,
<|startoftranscript|> 50257, 99 language tokens 50258-50356, <|translate|> 50357,
<|transcribe|> 50358, <|startoflm|> 50359, <|startofprev|> 50360, <|nocaptions|> 50361,
<|notimestamps|> 50362, then 1501 time tokens (vocabulary 51864). The generation config
declares the model multilingual with those ids, which is all transformers' ``generate``
and the adapter read; a real multilingual checkpoint differs only in the ids.
"""
from __future__ import annotations

from pathlib import Path

SOT, EOT, TRANSLATE, TRANSCRIBE, PREV, NO_TS = 50257, 50256, 50357, 50358, 50360, 50362
VOCAB = NO_TS + 1 + 1501


def build_tiny_whisper(out_dir: Path, multilingual: bool = True, n_mels: int = 80, decoder_layers: int = 2,
                       seed: int = 0, init_std: float = 0.2) -> Path:
    import torch
    from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForConditionalGeneration, WhisperProcessor, WhisperTokenizerFast)

    from shardscribe.pipeline.models.whisper.loader import embedded_ct2_dir

    tokenizer = WhisperTokenizerFast(tokenizer_file=str(embedded_ct2_dir() / "tokenizer.json"),
                                     unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                     eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    langs = {tokenizer.convert_ids_to_tokens(i): i for i in range(SOT + 1, TRANSLATE)}
    suppress = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93,
                SOT, TRANSLATE, TRANSCRIBE, 50359, PREV, 50361]
    begin_suppress = [220, EOT]
    config = WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=n_mels, d_model=64, encoder_layers=2, decoder_layers=decoder_layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=1500, max_target_positions=448, pad_token_id=EOT, bos_token_id=EOT,
        eos_token_id=EOT, decoder_start_token_id=SOT, suppress_tokens=suppress,
        begin_suppress_tokens=begin_suppress, init_std=init_std, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT, bos_token_id=EOT,
        suppress_tokens=suppress, begin_suppress_tokens=begin_suppress, no_timestamps_token_id=NO_TS,
        is_multilingual=multilingual, prev_sot_token_id=PREV, max_initial_timestamp_index=50,
        max_length=448, alignment_heads=[[0, 1], [1, 0], [1, 3]],
        **({"lang_to_id": langs, "task_to_id": {"translate": TRANSLATE, "transcribe": TRANSCRIBE}}
           if multilingual else {}))
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    WhisperProcessor(WhisperFeatureExtractor(feature_size=n_mels), tokenizer).save_pretrained(out_dir)
    return out_dir
