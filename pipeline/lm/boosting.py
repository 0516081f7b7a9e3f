"""GPU-PB: a phrase-boosting tree with Aho-Corasick fail links, in NGPU-LM's tensor format.

"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities", §III-B (the
phrase-boosting score P_PB of its eq. 1): key phrases are tokenised into a prefix tree
whose bonus is spread along the prefix depth instead of being paid only at the phrase end,
and the tree is stored like an n-gram LM so decoders call the same ``advance``. Here:

* token bonus at depth ``d`` (1-based) of a phrase with context score ``c``:
  ``c`` for ``d = 1``, ``c * depth_scaling + ln(d)`` deeper (the log-depth bonus);
  a node shared by several phrases takes the largest bonus;
* ``P(n)``: sum of bonuses from the root to node ``n``; ``bank(n)``: ``P`` of the deepest
  completed phrase on that path (0 if none); ``credit(n) = P(n) - bank(n)`` is the bonus
  still "on credit" for an unfinished match;
* trie edges are arcs weighted by the token bonus; the Aho-Corasick fail link is the
  back-off arc with weight ``credit(fail) - credit(n) + bank(fail)``: a failed partial match
  takes its credit back, a completed phrase keeps its bonus, and a phrase that ends inside
  the failed match (its suffix, ``bank(fail)``) is paid when the match fails;
* the end-of-utterance weight (``final``) is the whole back-off chain to the root: open
  credit is taken back.

So along any token sequence the summed bonuses plus ``final`` equal the sum of ``P`` over
the phrases completed (the longest one wins where a longer phrase contains a shorter one
that it completes with). Several phrase lists live in one graph, one root each, so every
utterance of a batch can boost its own list (``init_states(..., lists=...)``).
"""
from __future__ import annotations

import functools
import logging
import math
from collections import deque

import torch

from .backoff_graph import BackoffGraph, GraphScorer

log = logging.getLogger(__name__)


class BoostingTree(GraphScorer):
    """Boosting bonuses over an LM vocabulary of ``vocab_size`` tokens (same API as NGramLM)."""

    def __init__(self, graph: BackoffGraph, roots: torch.Tensor, row_lists: torch.Tensor | None = None):
        self.graph = graph
        self.roots = roots
        self.row_lists = row_lists

    def to(self, device) -> "BoostingTree":
        rows = None if self.row_lists is None else self.row_lists.to(device)
        return BoostingTree(self.graph.to(device), self.roots.to(device), rows)

    def with_lists(self, row_lists: torch.Tensor) -> "BoostingTree":
        """The same tree with each utterance's phrase list bound, so a decoder that only
        calls ``init_states(B * beam)`` gets per-utterance boosting (rows repeated per beam)."""
        return BoostingTree(self.graph, self.roots, torch.as_tensor(row_lists, dtype=torch.int64).to(self.device))

    @classmethod
    def from_phrases(cls, phrase_lists, vocab_size: int, tokenize=None, context_score: float = 1.0,
                     depth_scaling: float = 2.0) -> "BoostingTree":
        """``phrase_lists``: one list per utterance group; each phrase is a token-id list, a
        string (tokenised with ``tokenize``), or a ``(phrase, context_score)`` pair."""
        return cls(*_compile(phrase_lists, vocab_size, tokenize, context_score, depth_scaling))

    def init_states(self, batch_size: int, bos: bool = True, lists: torch.Tensor | None = None) -> torch.Tensor:
        """Start states; ``lists[b]`` picks the phrase list of row ``b`` (default: the lists
        bound by ``with_lists``, else list 0). With ``batch_size = len(lists) * beam`` each
        list is repeated for the ``beam`` consecutive rows of its utterance.
        ``bos`` is accepted for API symmetry with the LM: a phrase can start anywhere."""
        lists = self.row_lists if lists is None else lists
        if lists is None:
            return self.roots[:1].expand(batch_size).clone()
        lists = torch.as_tensor(lists, dtype=torch.int64).to(self.device)
        if batch_size % lists.numel():
            raise ValueError(f"batch of {batch_size} rows for {lists.numel()} phrase lists")
        return self.roots[lists.repeat_interleave(batch_size // lists.numel())]

    def score_sentences(self, tokens: torch.Tensor, lengths: torch.Tensor, lists: torch.Tensor | None = None,
                        eos: bool = True) -> torch.Tensor:
        states = self.init_states(tokens.shape[0], lists=lists)
        return self.graph.score_sequences(states, tokens, lengths, eos)


def _phrase_tokens(phrase, tokenize, default_score: float):
    score = default_score
    if isinstance(phrase, tuple):
        phrase, score = phrase
    if isinstance(phrase, str):
        if tokenize is None:
            raise ValueError("text phrases need a tokenize function")
        phrase = tokenize(phrase)
    return [int(t) for t in phrase], float(score)


def _compile(phrase_lists, vocab_size, tokenize, context_score, depth_scaling):
    parent, token_score, is_end, children, root_of = [], [], [], [], []

    def new_node(par: int, score: float, root: int) -> int:
        parent.append(par)
        token_score.append(score)
        is_end.append(False)
        children.append({})
        root_of.append(root if root >= 0 else len(parent) - 1)
        return len(parent) - 1

    roots, max_len = [], 0
    for phrases in (phrase_lists or [[]]):
        root = new_node(-1, 0.0, -1)
        roots.append(root)
        for phrase in phrases:
            tokens, score = _phrase_tokens(phrase, tokenize, context_score)
            if not tokens:
                continue
            if not all(0 <= t < vocab_size for t in tokens):
                raise ValueError(f"phrase {phrase!r} has tokens outside the vocabulary of {vocab_size}")
            max_len = max(max_len, len(tokens))
            node = root
            for depth, tok in enumerate(tokens, start=1):
                bonus = score if depth == 1 else score * depth_scaling + math.log(depth)
                child = children[node].get(tok)
                if child is None:
                    child = new_node(node, bonus, root)
                    children[node][tok] = child
                else:
                    token_score[child] = max(token_score[child], bonus)
                node = child
            is_end[node] = True

    num = len(parent)
    potential, bank, fail = [0.0] * num, [0.0] * num, list(range(num))
    order = []  # breadth-first, so fail targets (shallower) are final before they are used
    queue = deque(roots)
    while queue:
        u = queue.popleft()
        order.append(u)
        for tok, c in children[u].items():
            potential[c] = potential[u] + token_score[c]
            bank[c] = potential[c] if is_end[c] else bank[u]
            if parent[u] < 0:
                fail[c] = u
            else:
                f = fail[u]
                while parent[f] >= 0 and tok not in children[f]:
                    f = fail[f]
                fail[c] = children[f].get(tok, f)
            queue.append(c)

    credit = [p - b for p, b in zip(potential, bank)]
    backoff_w, final_w = [0.0] * num, [0.0] * num
    for u in order:
        if parent[u] >= 0:
            f = fail[u]
            backoff_w[u] = credit[f] - credit[u] + bank[f]
            final_w[u] = backoff_w[u] + final_w[f]

    arcs = [(u, tok, token_score[c], c) for u in range(num) if parent[u] >= 0
            for tok, c in children[u].items()]
    root_w = torch.zeros(len(roots), vocab_size)
    root_to = torch.tensor(roots, dtype=torch.int64)[:, None].repeat(1, vocab_size)
    for row, root in enumerate(roots):
        for tok, c in children[root].items():
            root_w[row, tok] = token_score[c]
            root_to[row, tok] = c
    graph = BackoffGraph.build(
        vocab_size=vocab_size, depth=max_len,
        arcs_from=[a[0] for a in arcs], arcs_label=[a[1] for a in arcs],
        arcs_w=[a[2] for a in arcs], arcs_to=[a[3] for a in arcs],
        backoff_to=fail, backoff_w=backoff_w, final_w=final_w, root_of=root_of, roots=roots,
        root_w=root_w, root_to=root_to)
    return graph, torch.tensor(roots, dtype=torch.int64)


def read_phrase_file(path: str) -> list[str]:
    """Key phrases from a text file, one per line (blank lines and ``#`` comments skipped)."""
    with open(path, encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")]


def case_variants(phrases: list) -> list:
    """Each phrase as given, then with the case of its first letter flipped where its first
    word is lower or title case ("check" -> "Check", "The supervisor" <-> "the supervisor").

    A cased character vocabulary spells a phrase two ways depending on whether it starts a
    sentence, and a tree built from one spelling boosts nothing of the other: on the
    held-out maintenance set a third of the missed phrase occurrences were sentence-initial
    "The ..." or mid-sentence "check" against list entries "the ..." and "Check". Acronyms
    and mixed-case words ("RPM", "iPhone") are kept as given only. ``(phrase, score)``
    pairs keep their score; token-id phrases pass through."""
    out, seen = [], set()

    def add(item):
        key = repr(item)  # token-id phrases are lists, which do not hash
        if key not in seen:
            seen.add(key)
            out.append(item)

    for item in phrases:
        phrase, score = item if isinstance(item, tuple) else (item, None)
        add(item)
        if not isinstance(phrase, str) or not phrase[:1].isalpha():
            continue
        word = phrase.split(" ", 1)[0]
        if word.islower() or word.istitle():
            flipped = phrase[0].swapcase() + phrase[1:]
            add(flipped if score is None else (flipped, score))
    return out


def batch_phrase_lists(shared: list[str], per_row: list[list[str] | None]) -> tuple[list[list[str]], torch.Tensor]:
    """Phrase lists for one batch: every row boosts the shared phrases (file/config) plus its
    own ``key_phrases``; rows with equal lists share one root. Returns the distinct lists
    and the list index of each row, for ``BoostingTree.from_phrases`` / ``init_states``."""
    index: dict[tuple[str, ...], int] = {}
    lists: list[list[str]] = []
    rows = []
    for own in per_row:
        # A phrase of white space alone would boost the word separator everywhere.
        key = tuple(dict.fromkeys(p for p in list(shared) + list(own or []) if p.strip()))
        if key not in index:
            index[key] = len(lists)
            lists.append(list(key))
        rows.append(index[key])
    return lists, torch.tensor(rows, dtype=torch.int64)


def configured_phrases(beam_cfg) -> list[str]:
    """The phrases every row of a job is boosted with: ``beam.key_phrases`` plus the lines
    of ``beam.key_phrases_file``."""
    phrases = list(beam_cfg.key_phrases or [])
    if beam_cfg.key_phrases_file:
        phrases += read_phrase_file(beam_cfg.key_phrases_file)
    return phrases


def batch_boosting_tree(shared: list[str], per_row: list, vocabulary, beam_cfg, device, spell=None):
    """The boosting tree of one search batch: ``shared`` phrases plus each row's key
    phrases, spelt in ``vocabulary``'s LM token ids (``phrase_token_ids``: a phrase it
    cannot spell exactly is left out, never boosted misspelt), or None when there are none.
    A vocabulary with one case spells both first-letter variants alike (it folds phrases to
    its case), so the variants are added only where it is cased. ``spell``: the
    vocabulary's ``phrase_token_ids``, or a cache of it."""
    if not shared and not any(per_row):
        return None
    lists, rows = batch_phrase_lists(shared, per_row)
    if beam_cfg.boost_case_variants and vocabulary.cased:
        lists = [case_variants(phrases) for phrases in lists]
    spell = spell or vocabulary.phrase_token_ids
    spelt = [[ids for ids in map(spell, phrases) if ids is not None] for phrases in lists]
    if not any(spelt):
        return None
    tree = BoostingTree.from_phrases(spelt, vocabulary.size - 1, context_score=beam_cfg.context_score,
                                     depth_scaling=beam_cfg.depth_scaling)
    return tree.to(device).with_lists(rows)


def unspellable(phrases, spell) -> list[str]:
    """The phrases ``spell`` (a vocabulary's ``phrase_token_ids``) cannot spell exactly."""
    return [p for p in dict.fromkeys(phrases) if spell(p) is None]


# Spellings a beam pool keeps: its shared phrases are spelt for every batch, and a row's
# phrases are spelt twice (checked, then in the tree).
SPELLING_CACHE = 4096


class KeyPhrases:
    """A beam pool's phrase boosting: the job's shared phrases (``beam.key_phrases``, the
    lines of ``beam.key_phrases_file``) checked once against the model's vocabulary, and
    each batch's tree with the rows' own ``key_phrases``.

    A phrase the vocabulary cannot spell exactly is not boosted: a shared one is named in
    one warning when the pool starts, a row's are counted (``dropped_row_phrases``) and
    logged, and the row is transcribed with the rest of its phrases."""

    def __init__(self, beam_cfg, vocabulary):
        self.cfg, self.vocab = beam_cfg, vocabulary
        self._spell = functools.lru_cache(maxsize=SPELLING_CACHE)(vocabulary.phrase_token_ids)
        shared = configured_phrases(beam_cfg)
        dropped = set(unspellable(shared, self._spell))
        if dropped:
            log.warning("beam.key_phrases / beam.key_phrases_file: %d of %d phrases cannot be spelt by the "
                        "model's vocabulary and are not boosted: %s", len(dropped), len(set(shared)),
                        ", ".join(map(repr, sorted(dropped))))
        self.shared = [p for p in shared if p not in dropped]
        self.dropped_row_phrases = 0

    def tree(self, per_row: list, device):
        """The boosting tree of a batch whose rows have ``per_row`` key phrases (or None)."""
        dropped = unspellable((p for own in per_row for p in own or []), self._spell)
        if dropped:
            self.dropped_row_phrases += len(dropped)
            log.warning("%d key phrases of this batch's rows cannot be spelt by the model's vocabulary and are "
                        "not boosted (%d so far): %s", len(dropped), self.dropped_row_phrases,
                        ", ".join(map(repr, dropped[:10])))
        return batch_boosting_tree(self.shared, per_row, self.vocab, self.cfg, device, self._spell)
