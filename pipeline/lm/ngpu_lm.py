"""NGPU-LM: a token-level n-gram LM as tensors, queried for the whole vocabulary at once.

"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities", §II-D /
§III-B (NGPU-LM, Bataev et al.; the LM score P_LM of its eq. 1): the ARPA back-off model
is compiled into arcs sorted by (state, label), per-state back-off target/weight and a
resolved end-of-sentence weight (see ``backoff_graph``). States are the n-gram contexts
KenLM keeps: an n-gram is a state when it is the prefix of a longer n-gram (or carries a
back-off weight); after reading a token the state is the longest suffix of the history
that is a state. The start state (empty context) holds every vocabulary token: tokens
missing from the ARPA get the ``<unk>`` probability and lead back to the start state, as
in KenLM. All weights are natural logs (ARPA log10 x ln 10).

API (states are int64 tensors; V = LM vocabulary = the decoder's non-blank tokens):
``init_states(B, bos)``, ``advance(states[N]) -> (scores[N, V], next_states[N, V])``,
``advance_labels(states, labels)``, ``final(states)``, ``score_sentences``.
"""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from .arpa import BOS, EOS, UNK, Arpa, read_arpa, word_token
from .backoff_graph import BackoffGraph, GraphScorer

FORMAT = "shardscribe-ngpu-lm/1"
KENLM_MISSING_UNK_LOG10 = -100.0  # KenLM's probability for <unk> when an ARPA omits it


def _word_level_message(path: str, words: list[str]) -> str:
    sample = ", ".join(repr(w) for w in words[:5])
    return (f"{path} is a word-level ARPA (words such as {sample}); NGPU-LM needs a token-level "
            "ARPA whose words are decoder token ids written as chr(id + 100). Rebuild it from "
            "the text with `shardscribe build-lm --text FILE --tokenizer TOKENIZER`: a word "
            "n-gram cannot be turned into an exact token n-gram by spelling its words.")


class NGramLM(GraphScorer):
    """Batched n-gram LM over an LM vocabulary of ``vocab_size`` tokens."""

    def __init__(self, graph: BackoffGraph, order: int, bos_state: int, start_state: int):
        self.graph = graph
        self.order = order
        self.bos_state = bos_state
        self.start_state = start_state

    def to(self, device) -> "NGramLM":
        return NGramLM(self.graph.to(device), self.order, self.bos_state, self.start_state)

    # ------------------------------------------------------------ construction
    @classmethod
    def from_arpa(cls, path_or_arpa, vocab_size: int | None = None) -> "NGramLM":
        """Compile a token-level ARPA. ``vocab_size`` defaults to the largest token id + 1."""
        arpa = path_or_arpa if isinstance(path_or_arpa, Arpa) else read_arpa(path_or_arpa)
        name = path_or_arpa if isinstance(path_or_arpa, str) else "ARPA"
        bad = arpa.non_token_words()
        if bad:
            raise ValueError(_word_level_message(str(name), bad))
        tokens = [t for t in (word_token(w) for w in arpa.words()) if t is not None]
        needed = max(tokens, default=-1) + 1
        vocab_size = needed if vocab_size is None else vocab_size
        if needed > vocab_size:
            raise ValueError(f"ARPA has token id {needed - 1}, outside the vocabulary of {vocab_size}")
        return cls(_compile(arpa, vocab_size), arpa.order, *_special_states(arpa))

    def save(self, path: str) -> None:
        meta = {"format": FORMAT, "order": str(self.order), "vocab_size": str(self.vocab_size),
                "depth": str(self.graph.depth), "bos_state": str(self.bos_state),
                "start_state": str(self.start_state)}
        save_file({k: v.cpu() for k, v in self.graph.tensors().items()}, path, metadata=meta)

    @classmethod
    def load(cls, path: str, device="cpu") -> "NGramLM":
        from safetensors import safe_open

        with safe_open(path, framework="pt") as fh:
            meta = fh.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not an NGPU-LM file (format {meta.get('format')!r})")
        tensors = load_file(path, device=str(device))
        graph = BackoffGraph.from_tensors(tensors, int(meta["vocab_size"]), int(meta["depth"]))
        return cls(graph, int(meta["order"]), int(meta["bos_state"]), int(meta["start_state"]))

    # ------------------------------------------------------------------- API
    def init_states(self, batch_size: int, bos: bool = True) -> torch.Tensor:
        state = self.bos_state if bos else self.start_state
        return torch.full((batch_size,), state, dtype=torch.int64, device=self.device)

    def score_sentences(self, tokens: torch.Tensor, lengths: torch.Tensor, bos: bool = True,
                        eos: bool = True) -> torch.Tensor:
        """Per-token scores [B, L + 1] of right-padded token rows; column ``lengths[b]``
        holds the end-of-sentence score when ``eos``. Row sums are sentence log-probs."""
        states = self.init_states(tokens.shape[0], bos)
        return self.graph.score_sequences(states, tokens, lengths, eos)

    def describe(self) -> str:
        return json.dumps({"order": self.order, "vocab_size": self.vocab_size,
                           "states": self.graph.num_states, "arcs": int(self.graph.arc_key.numel()),
                           "bytes": self.graph.nbytes()})


def _special_states(arpa: Arpa) -> tuple[int, int]:
    states = _state_index(arpa)
    return states.get((BOS,), 0), 0


def _state_index(arpa: Arpa) -> dict[tuple[str, ...], int]:
    """Contexts that are states: the empty context, prefixes of longer n-grams, and
    n-grams with a back-off weight. Sorted by length then words, for determinism."""
    contexts = {()}
    for n in range(1, arpa.order):
        for gram, (_, backoff) in arpa.ngrams[n - 1].items():
            if backoff != 0.0:
                contexts.add(gram)
    for n in range(2, arpa.order + 1):
        for gram in arpa.ngrams[n - 1]:
            contexts.add(gram[:-1])
    return {ctx: i for i, ctx in enumerate(sorted(contexts, key=lambda c: (len(c), c)))}


def _compile(arpa: Arpa, vocab_size: int) -> BackoffGraph:
    states = _state_index(arpa)

    def resolve(words: tuple[str, ...]) -> int:
        for i in range(len(words)):
            state = states.get(words[i:])
            if state is not None:
                return state
        return 0

    grams = arpa.ngrams
    unigrams = grams[0]
    unk_logp = unigrams[(UNK,)][0] if (UNK,) in unigrams else KENLM_MISSING_UNK_LOG10 * 2.302585092994046
    root_w = [unk_logp] * vocab_size
    root_to = [0] * vocab_size
    for (word,), (logp, _) in unigrams.items():
        token = word_token(word)
        if token is not None:
            root_w[token] = logp
            root_to[token] = resolve((word,))

    arcs_from, arcs_label, arcs_w, arcs_to = [], [], [], []
    for n in range(2, arpa.order + 1):
        for gram, (logp, _) in grams[n - 1].items():
            token = word_token(gram[-1])
            if token is None:  # </s> goes to final_w; <s> is never predicted
                continue
            arcs_from.append(states[gram[:-1]])
            arcs_label.append(token)
            arcs_w.append(logp)
            arcs_to.append(resolve(gram))

    num_states = len(states)
    backoff_to = [0] * num_states
    backoff_w = [0.0] * num_states
    final_w = [0.0] * num_states
    for ctx, s in states.items():
        if ctx:
            backoff_to[s] = resolve(ctx[1:])
            backoff_w[s] = grams[len(ctx) - 1][ctx][1] if ctx in grams[len(ctx) - 1] else 0.0
        final_w[s] = _resolved_eos(grams, ctx)
    return BackoffGraph.build(
        vocab_size=vocab_size, depth=max(arpa.order - 1, 0), arcs_from=arcs_from,
        arcs_label=arcs_label, arcs_w=arcs_w, arcs_to=arcs_to, backoff_to=backoff_to,
        backoff_w=backoff_w, final_w=final_w, root_of=[0] * num_states, roots=[0],
        root_w=root_w, root_to=root_to)


def _resolved_eos(grams, ctx: tuple[str, ...]) -> float:
    """log p(</s> | ctx) through Katz back-off."""
    acc = 0.0
    while True:
        gram = ctx + (EOS,)
        if len(gram) <= len(grams) and gram in grams[len(gram) - 1]:
            return acc + grams[len(gram) - 1][gram][0]
        if not ctx:
            return acc + KENLM_MISSING_UNK_LOG10 * 2.302585092994046
        acc += grams[len(ctx) - 1][ctx][1] if ctx in grams[len(ctx) - 1] else 0.0
        ctx = ctx[1:]
