"""KenLM behind the NGPU-LM API: the reference for exactness tests and the speed baseline.

Same calls as ``NGramLM`` ("FlexCTC: GPU-powered CTC Beam Decoding with advanced
Contextual Abilities", §II-D, names KenLM as the CPU toolkit NGPU-LM replaces), answered
by the ``kenlm`` Python module one (state, token) pair at a time, which is how a CPU
library is called from a decoder. KenLM states are interned to int64 ids so that callers
see the same tensor API; scores are converted from log10 to natural log. Tokens are ARPA
words ``chr(id + 100)`` and are passed to KenLM one by one (never through ``str.split``,
which would split U+0085/U+00A0 tokens).
"""
from __future__ import annotations

import math

import torch

from ...lm.arpa import EOS, token_word

LN10 = math.log(10.0)


class KenLMReference:
    def __init__(self, path: str, vocab_size: int):
        import kenlm

        self._kenlm = kenlm
        self.model = kenlm.Model(path)
        self.vocab_size = vocab_size
        self.words = [token_word(t) for t in range(vocab_size)]
        self._states: list = []
        self._ids: dict = {}
        begin, null = kenlm.State(), kenlm.State()
        self.model.BeginSentenceWrite(begin)
        self.model.NullContextWrite(null)
        self.bos_state = self._intern(begin)
        self.start_state = self._intern(null)

    def _intern(self, state) -> int:
        sid = self._ids.get(state)
        if sid is None:
            sid = len(self._states)
            self._ids[state] = sid
            self._states.append(state)
        return sid

    def init_states(self, batch_size: int, bos: bool = True) -> torch.Tensor:
        return torch.full((batch_size,), self.bos_state if bos else self.start_state, dtype=torch.int64)

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base_score, new_state = self.model.BaseScore, self._kenlm.State
        rows = states.tolist()
        scores = [[0.0] * self.vocab_size for _ in rows]
        nexts = [[0] * self.vocab_size for _ in rows]
        for i, sid in enumerate(rows):
            state = self._states[sid]
            score_row, next_row = scores[i], nexts[i]
            for t, word in enumerate(self.words):
                out = new_state()
                score_row[t] = base_score(state, word, out) * LN10
                next_row[t] = self._intern(out)
        return torch.tensor(scores, dtype=torch.float32), torch.tensor(nexts, dtype=torch.int64)

    def advance_labels(self, states: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores, nexts = [], []
        for sid, label in zip(states.tolist(), labels.tolist()):
            out = self._kenlm.State()
            scores.append(self.model.BaseScore(self._states[sid], self.words[label], out) * LN10)
            nexts.append(self._intern(out))
        return torch.tensor(scores, dtype=torch.float32), torch.tensor(nexts, dtype=torch.int64)

    def final(self, states: torch.Tensor) -> torch.Tensor:
        out = self._kenlm.State()
        return torch.tensor([self.model.BaseScore(self._states[s], EOS, out) * LN10
                             for s in states.tolist()], dtype=torch.float32)

    def score_sentences(self, tokens: torch.Tensor, lengths: torch.Tensor, bos: bool = True,
                        eos: bool = True) -> torch.Tensor:
        out = torch.zeros(tokens.shape[0], tokens.shape[1] + 1, dtype=torch.float32)
        for b, (row, length) in enumerate(zip(tokens.tolist(), lengths.tolist())):
            state = self._states[self.bos_state if bos else self.start_state]
            for t, token in enumerate(row[:length] + ([None] if eos else [])):
                nxt = self._kenlm.State()
                word = EOS if token is None else self.words[token]
                out[b, t] = self.model.BaseScore(state, word, nxt) * LN10
                state = nxt
        return out
