"""A transcript's decoder tokens, as the decoder writes them, without loading the model.

Not a paper algorithm: the tokenisation a token map is built with ("Model-free
Speculative Decoding for Transformer-based ASR with Token Map Drafting", Algorithm 1,
line 4) must give exactly the ids the decoder generates. Whisper's transcripts start with
a space token (pipeline.models.whisper.adapter.WhisperAdapter.tokenize); an LLM's
assistant turn (granite-speech) starts without one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

EMBEDDED = "embedded"


@dataclass
class TranscriptTokenizer:
    name: str
    vocab_size: int
    encode: Callable[[str], list[int]]


def load_transcript_tokenizer(spec: str) -> TranscriptTokenizer:
    """``embedded`` (the embedded Whisper tiny.en's tokenizer) or a local model directory
    holding a tokenizer (Whisper checkpoints get the leading space)."""
    if spec == EMBEDDED:
        from tokenizers import Tokenizer

        from .whisper.loader import embedded_ct2_dir

        tok = Tokenizer.from_file(str(embedded_ct2_dir() / "tokenizer.json"))
        return TranscriptTokenizer("embedded whisper tiny.en", tok.get_vocab_size(with_added_tokens=True),
                                   lambda s: tok.encode(" " + s.strip(), add_special_tokens=False).ids)
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(f"tokenizer {spec!r}: not 'embedded' and not a model directory")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one clear message
        raise ValueError(f"tokenizer {spec!r}: no tokenizer could be loaded from it ({exc})") from exc
    config = path / "config.json"
    model_type = json.loads(config.read_text()).get("model_type", "") if config.is_file() else ""
    lead = " " if model_type == "whisper" or "Whisper" in type(tok).__name__ else ""
    return TranscriptTokenizer(str(path), len(tok), lambda s: tok.encode(lead + s.strip(), add_special_tokens=False))
