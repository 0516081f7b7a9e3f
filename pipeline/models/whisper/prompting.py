"""Whisper's decoder prompt and timestamp rules ("Robust Speech Recognition via Large-Scale
Weak Supervision", §2.3 "Multitask Format" and Figure 1; decoding heuristics of §4.5).

The prompt is the forced prefix of every segment: optional previous text
(``<|startofprev|>`` + the initial prompt's tokens), ``<|startoftranscript|>``, a language
token (multilingual models), a task token (transcribe / translate), and
``<|notimestamps|>`` unless timestamps are decoded. The language token is either fixed or
the most probable language token after ``<|startoftranscript|>`` alone (language
identification, §2.3), with its probability among the language tokens (among the
candidates, where model.language_candidates restricts them).

With timestamps the text is interleaved with time tokens (``<|0.00|>`` .. ``<|30.00|>``,
0.02 s apart). ``TimestampRules`` applies the paper's rules per row: the first token is a
time token (at most ``max_initial_timestamp_index`` steps in); time tokens come in pairs
except right before end-of-text; times never decrease; where the time tokens' total
probability beats every single text token, a time token is taken. ``split_timestamps``
cuts a decoded row into its timed spans.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TIME_PRECISION = 0.02  # seconds per time token step


@dataclass(frozen=True)
class WhisperOptions:
    """What the job asks of Whisper's decoder (pipeline.config.ModelConfig's keys)."""
    language: str | None = None      # a code, "auto", or None (the model's default)
    task: str = "transcribe"
    initial_prompt: str | None = None
    timestamps: bool = False
    word_timestamps: bool = False
    language_detection: str = "recording"        # with auto: once per recording, or per segment
    language_candidates: tuple[str, ...] | None = None   # with auto: the languages it may pick

    @classmethod
    def of(cls, model_config) -> "WhisperOptions":
        candidates = getattr(model_config, "language_candidates", None)
        return cls(language=model_config.language, task=model_config.task,
                   initial_prompt=model_config.initial_prompt, timestamps=model_config.timestamps,
                   word_timestamps=model_config.word_timestamps,
                   language_detection=getattr(model_config, "language_detection", "recording"),
                   language_candidates=tuple(candidates) if candidates else None)


@dataclass
class WhisperTokens:
    """The special token ids of one checkpoint (from its generation config and tokenizer)."""
    sot: int
    eot: int
    no_timestamps: int | None
    prev: int | None                 # <|startofprev|>
    lang_to_id: dict[str, int]       # "de" -> id of <|de|>
    task_to_id: dict[str, int]
    multilingual: bool

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @classmethod
    def of(cls, model, tokenizer) -> "WhisperTokens":
        gen, cfg = model.generation_config, model.config
        lang = {k.strip("<|>"): int(v) for k, v in (getattr(gen, "lang_to_id", None) or {}).items()}
        no_ts = getattr(gen, "no_timestamps_token_id", None)
        prev = getattr(gen, "prev_sot_token_id", None)
        if prev is None:
            found = tokenizer.convert_tokens_to_ids("<|startofprev|>")
            prev = found if isinstance(found, int) and found != tokenizer.unk_token_id else None
        return cls(sot=int(cfg.decoder_start_token_id),
                   eot=int(gen.eos_token_id if gen.eos_token_id is not None else cfg.eos_token_id),
                   no_timestamps=None if no_ts is None else int(no_ts), prev=prev, lang_to_id=lang,
                   task_to_id={k: int(v) for k, v in (getattr(gen, "task_to_id", None) or {}).items()},
                   multilingual=bool(getattr(gen, "is_multilingual", False)))


def options_error(tokens: WhisperTokens, language: str | None, task: str, timestamps: bool,
                  candidates=None) -> str | None:
    """Why these options cannot run on this checkpoint (None: they can); the message names
    the key."""
    if not tokens.multilingual:
        if language not in (None, "en"):
            return f"model.language={language}: an English-only model; use en or null"
        if task != "transcribe":
            return f"model.task={task}: an English-only model cannot translate; use a multilingual model"
    else:
        if language not in (None, "auto") and language not in tokens.lang_to_id:
            return f"model.language={language}: not one of the model's {len(tokens.lang_to_id)} languages"
        if task not in tokens.task_to_id:
            return f"model.task={task}: the model's generation config has no such task token"
        unknown = [c for c in candidates or () if c not in tokens.lang_to_id]
        if unknown:
            return (f"model.language_candidates: {unknown[0]} is not one of the model's "
                    f"{len(tokens.lang_to_id)} languages")
    if timestamps and tokens.no_timestamps is None:
        return "model.timestamps: the model's generation config has no <|notimestamps|> token"
    return None


def prefix(tokens: WhisperTokens, language_id: int | None, task: str, timestamps: bool,
           previous: list[int]) -> list[int]:
    """One segment's forced decoder prefix."""
    out = [tokens.prev, *previous] if previous else []
    out.append(tokens.sot)
    if tokens.multilingual:
        out += [language_id, tokens.task_to_id[task]]
    if not timestamps and tokens.no_timestamps is not None:
        out.append(tokens.no_timestamps)
    return out


@torch.inference_mode()
def language_logprobs(adapter, encoder_states: torch.Tensor, tokens: WhisperTokens) -> torch.Tensor:
    """Per row: the log-probabilities of the language tokens (in ``tokens.lang_to_id``'s
    order) after ``<|startoftranscript|>`` alone, normalised over the language tokens (one
    decoder step)."""
    B = encoder_states.shape[0]
    ids = torch.full((B, 1), tokens.sot, dtype=torch.long, device=encoder_states.device)
    positions = torch.zeros_like(ids)
    hidden, _ = adapter.decoder_hidden(ids, encoder_states, None, torch.ones_like(ids), positions)
    logits = adapter.logits(hidden[:, -1])
    lang_ids = torch.tensor(list(tokens.lang_to_id.values()), device=logits.device)
    return logits[:, lang_ids].float().log_softmax(-1)


def detect_language(adapter, encoder_states: torch.Tensor, tokens: WhisperTokens, candidates=None):
    """Per row: the most probable language token after ``<|startoftranscript|>`` and its
    probability among the language tokens; with ``candidates`` (codes) the argmax and the
    probability are among those languages only."""
    logprobs = language_logprobs(adapter, encoder_states, tokens)
    lang_ids = torch.tensor(list(tokens.lang_to_id.values()), device=logprobs.device)
    if candidates:
        allowed = torch.tensor([code in candidates for code in tokens.lang_to_id], device=logprobs.device)
        logprobs = logprobs.masked_fill(~allowed, float("-inf")).log_softmax(-1)
    probs = logprobs.exp()
    best = probs.argmax(-1)
    return lang_ids[best].tolist(), probs.gather(1, best[:, None]).squeeze(1).tolist()


class TimestampRules:
    """The timestamp rules over a batch's logits (see the module docstring); ``rows`` are
    the tokens each row has generated so far (its forced prefix excluded)."""

    def __init__(self, tokens: WhisperTokens, max_initial_index: int | None):
        self.begin = tokens.timestamp_begin
        self.no_timestamps = tokens.no_timestamps
        self.eot = tokens.eot
        self.max_initial = max_initial_index

    def __call__(self, logits: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
        tb, ninf = self.begin, float("-inf")
        logits[:, self.no_timestamps] = ninf
        for k, seq in enumerate(rows):
            last = len(seq) >= 1 and seq[-1] >= tb
            penultimate = len(seq) < 2 or seq[-2] >= tb
            if last:
                if penultimate:
                    logits[k, tb:] = ninf      # a pair just closed: text or end next
                else:
                    logits[k, :self.eot] = ninf  # a lone time token: its pair (or end) next
            times = [t for t in seq if t >= tb]
            if times:
                # Times never decrease; a pair's second token may repeat the first.
                floor = times[-1] if last and not penultimate else times[-1] + 1
                logits[k, tb:floor] = ninf
            if not seq:
                logits[k, :tb] = ninf
                if self.max_initial is not None:
                    logits[k, tb + self.max_initial + 1:] = ninf
        logprobs = logits.float().log_softmax(-1)
        take_time = logprobs[:, tb:].logsumexp(-1) > logprobs[:, :tb].max(-1).values
        logits[:, :tb].masked_fill_(take_time[:, None], ninf)
        return logits


def split_timestamps(token_ids: list[int], begin: int) -> tuple[list[int], list[tuple[float, float | None, list[int]]]]:
    """(text tokens, spans) of a row decoded with timestamps: each span is (start, end,
    its text tokens), times in seconds from the segment's start. Text that no time token
    closes (end-of-text or the token limit right after text) is a span with end None: it
    runs to the end of the audio."""
    text, spans = [], []
    start = None
    current: list[int] = []
    last_time = 0.0
    for t in token_ids:
        if t >= begin:
            time = (t - begin) * TIME_PRECISION
            if start is None:
                start = time
            else:
                if current:
                    spans.append((start, time, current))
                start, current = None, []
            last_time = time
        else:
            current.append(t)
            text.append(t)
            if start is None:
                start = last_time
    if current:
        spans.append((start if start is not None else last_time, None, current))
    return text, spans
