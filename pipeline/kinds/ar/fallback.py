"""Temperature fallback for greedy decoding, as Whisper decodes ("Robust Speech Recognition
via Large-Scale Weak Supervision", §4.5 and its Table 7: "temperature fallback"; the same
rule in openai-whisper's ``decode_with_fallback`` and faster-whisper's
``generate_with_fallback``).

A row whose greedy (temperature 0) text fails either check is decoded again by sampling
at the next temperature, until it passes or the temperatures run out:

- its compression ratio (UTF-8 bytes over zlib bytes, pipeline.filters) is above
  ``compression_ratio`` (2.4): a repetition loop;
- the mean log-probability of its tokens under the model (the unscaled logits, as Whisper
  scores a sample) is below ``logprob`` (-1.0): the decoder did not believe its text.

When every temperature fails, the kept text is faster-whisper's choice: among the tries
under the compression threshold (all tries if none), the one of highest mean
log-probability.

Sampling runs inside the greedy loop (pipeline.decoding.ar.greedy) through its logit-edit
hook, without a second decoding loop: each step's token is drawn from
``softmax(logits / T)`` and the logits are masked to it. The draw of each step comes from a
generator seeded by the seed, the temperature and the row's tokens so far: a row's sample
depends on its own audio and tokens only, not on the batch it was decoded in, and a rerun
gives the same text.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...filters import compression_ratio
from ...models.whisper.language_check import mean_logprobs

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel


@dataclass(frozen=True)
class FallbackRule:
    """The fallback's settings (decoder.temperature_fallback and the keys beside it)."""
    temperatures: tuple[float, ...]
    compression_ratio: float | None
    logprob: float | None
    seed: int

    @classmethod
    def of(cls, decoder_cfg, task: str | None) -> "FallbackRule | None":
        """The rule ``decoder_cfg`` asks for on a job of Whisper task ``task``, or None
        where the fallback does not apply (off, or ``translate`` on another task)."""
        mode = decoder_cfg.temperature_fallback
        if mode == "off" or (mode == "translate" and task != "translate") or not decoder_cfg.fallback_temperatures:
            return None
        return cls(tuple(float(t) for t in decoder_cfg.fallback_temperatures),
                   decoder_cfg.fallback_compression_ratio, decoder_cfg.fallback_logprob, decoder_cfg.fallback_seed)

    def fails(self, text: str, mean_logprob: float) -> bool:
        too_repetitive = self.compression_ratio is not None and compression_ratio(text) > self.compression_ratio
        unlikely = self.logprob is not None and mean_logprob < self.logprob
        return too_repetitive or unlikely


class GumbelSampling:
    """A logit edit (``TokenRules.edit``) that turns greedy steps into draws at
    ``temperature``: each row's token is drawn from the softmax of its masked logits over
    ``temperature``, with a generator seeded by ``seed``, the temperature and the row's
    history, and its logits left finite at that token alone (the loop's argmax then takes
    it). The same draw as the Gumbel-max trick, at one random number per row and step."""

    def __init__(self, temperature: float, seed: int, then=None):
        self.temperature = temperature
        self.seed = seed
        self.then = then            # an edit that applies first (Whisper's timestamp rules)
        self._generator = torch.Generator()

    def _seed(self, history: list[int]) -> int:
        key = hashlib.blake2b(np.asarray(history, dtype=np.int64).tobytes(), digest_size=8,
                              key=f"{self.seed}:{self.temperature}".encode()).digest()
        return int.from_bytes(key, "little") & ((1 << 63) - 1)

    def __call__(self, logits: torch.Tensor, histories: list[list[int]]) -> None:
        if self.then is not None:
            self.then(logits, histories)
        probs = (logits.float() / self.temperature).softmax(-1).cpu()
        picks = []
        for k, history in enumerate(histories):
            self._generator.manual_seed(self._seed(history))
            picks.append(int(torch.multinomial(probs[k], 1, generator=self._generator)))
        keep = torch.tensor(picks, device=logits.device).unsqueeze(-1)
        chosen = logits.gather(-1, keep)
        logits.fill_(float("-inf")).scatter_(-1, keep, chosen)


def decode_with_fallback(adapter: ARDecoderModel, encoder_states: torch.Tensor, tokens: list[list[int]],
                         rule: FallbackRule, decode,
                         prompts: list[list[int]] | None = None) -> tuple[list[list[int]], list[int]]:
    """``tokens`` (the greedy rows) with each row that fails ``rule`` decoded again at the
    rule's temperatures; ``decode(rows, temperature)`` samples the given rows (indices
    into the batch) at ``temperature``. Returns (tokens, the temperature index each row
    ended at: 0 for greedy, k for the k-th fallback temperature)."""
    out = [list(t) for t in tokens]
    used = [0] * len(out)
    lps = mean_logprobs(adapter, encoder_states, out, prompts)
    tries = {r: [(out[r], lps[r], 0)] for r in range(len(out)) if rule.fails(adapter.text(out[r]), lps[r])}
    pending = sorted(tries)
    for k, temperature in enumerate(rule.temperatures, start=1):
        if not pending:
            break
        sampled = decode(pending, temperature)
        sub_states = encoder_states[pending]
        sub_prompts = [prompts[r] for r in pending] if prompts is not None else None
        sampled_lps = mean_logprobs(adapter, sub_states, sampled, sub_prompts)
        still = []
        for r, toks, lp in zip(pending, sampled, sampled_lps):
            tries[r].append((toks, lp, k))
            if rule.fails(adapter.text(toks), lp):
                still.append(r)
            else:
                out[r], used[r] = toks, k
        pending = still
    for r in pending:
        # no temperature passed: faster-whisper's pick among the tries
        under = [t for t in tries[r] if rule.compression_ratio is None
                 or compression_ratio(adapter.text(t[0])) <= rule.compression_ratio] or tries[r]
        best = max(under, key=lambda t: t[1])
        out[r], used[r] = best[0], best[2]
    return out, used
