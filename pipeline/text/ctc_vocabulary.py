"""The vocabulary a CTC beam search runs over: its blank, its width, how a phrase is spelt
in the LM's token ids, and how token ids become text.

"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities" fuses an n-gram
LM and a phrase-boosting tree trained on the ASR model's own tokens (§IV-A); the search
(pipeline.decoding.ctc_beam) feeds those lookups the non-blank CTC tokens in order, i.e.
LM index = CTC id for ids below the blank and CTC id - 1 above it (its frames move blank
to column 0 and ``fusion.py`` reads internal label - 1). Every LM token id here follows
that rule, so ``build-lm`` and the search agree whatever the model's blank id.

Two implementations:
- :class:`CharsetVocabulary`: the embedded CTC head's character set
  (``pipeline.text.charset``: blank 0, printable ASCII, cased);
- :class:`TokenizerVocabulary`: a transformers CTC checkpoint's tokenizer
  (Wav2Vec2CTCTokenizer characters with a ``|`` word delimiter, SentencePiece-style ``▁``
  pieces like Parakeet's), built from the checkpoint directory's config and tokenizer
  alone (no weights), so the beam pool, which has no model, can build it cheaply.

Case: a vocabulary whose letters are all lower case (or all upper case) cannot spell the
other case, so :meth:`lm_token_ids` folds text to its case first (otherwise an LM corpus
or a key phrase in the wrong case would lose every letter as unknown), and flipping a
phrase's first letter (``beam.boost_case_variants``) would only spell the same tokens
twice: ``cased`` is False and the beam stage skips the variants.

Key phrases are spelt apart (:meth:`phrase_token_ids`): an LM corpus may lose a character
the vocabulary lacks, but a boosted phrase that lost a letter ("naïve" as "nave") or kept
only word separators (" - " as two delimiters) would boost text nobody said.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Protocol


class CTCVocabulary(Protocol):
    blank: int        # the blank's id in the model's CTC output
    size: int         # the CTC output width (blank included)
    cased: bool       # upper and lower case are different tokens

    def lm_token_ids(self, text: str) -> list[int]: ...

    def phrase_token_ids(self, text: str) -> list[int] | None: ...

    def decode(self, ids) -> str: ...

    def word_roles(self, ids) -> list[str]: ...


# How a token places word boundaries (pipeline.decoding.ctc_words): a word separator that
# belongs to no word (a space, ``|``, a lone ``▁``), a token that opens a word (``▁x``),
# or one that continues the current word.
SEPARATOR, WORD_START, CONTINUES = "separator", "start", "continues"


def lm_index(ids, blank: int) -> list[int]:
    """CTC ids (no blanks) -> LM token ids: the id's rank among the non-blank ids."""
    return [i if i < blank else i - 1 for i in ids]


_GAP = "\0"   # where a character the vocabulary cannot spell was


def phrase_spelling(text: str, spells: Callable[[str], bool]) -> str | None:
    """``text`` as a vocabulary spells it exactly, or None where it cannot.

    A letter or digit the vocabulary lacks makes it None: "lazy dög" boosted as "lazy dg"
    rewards a word that is not the phrase. Punctuation and symbols it lacks are left out,
    as the model cannot write them either ("lazy dog." -> "lazy dog", "e-mail" -> "email"),
    and the white space around a removed one is kept once ("a - b" -> "a b", not two word
    separators in a row, which no transcript contains). Case is the caller's (it folds
    ``text`` to the vocabulary's case first)."""
    chars = []
    for ch in text:
        if ch.isspace() or spells(ch):
            chars.append(ch)
        elif ch.isalnum():
            return None
        else:
            chars.append(_GAP)
    spelt = re.sub(rf"(\s?){_GAP}+(\s?)", lambda m: m.group(1) or m.group(2), "".join(chars))
    return spelt if spelt.strip() else None


def phrase_ids(vocabulary, ctc_ids: list[int]) -> list[int] | None:
    """LM token ids of a spelt phrase, or None where it is nothing but word separators: such
    a phrase would boost the space between every pair of words."""
    if not ctc_ids or all(role == SEPARATOR for role in vocabulary.word_roles(ctc_ids)):
        return None
    return lm_index(ctc_ids, vocabulary.blank)


class CharsetVocabulary:
    """The embedded head's characters (``pipeline.text.charset``), exactly as before."""

    cased = True

    def __init__(self):
        from . import charset

        self.blank, self.size = charset.BLANK, charset.NUM_CLASSES
        self.lm_token_ids, self.decode = charset.lm_token_ids, charset.decode
        self._space = charset.encode(" ")[0]
        self._encode, self._spells = charset.encode, set(charset.CHARS).__contains__

    def phrase_token_ids(self, text: str) -> list[int] | None:
        """LM token ids of key phrase ``text``, None where the characters cannot spell it."""
        spelt = phrase_spelling(text, self._spells)
        return None if spelt is None else phrase_ids(self, self._encode(spelt))

    def word_roles(self, ids) -> list[str]:
        return [SEPARATOR if i == self._space else CONTINUES for i in ids]


def _letter_case(tokens) -> str | None:
    """'lower' / 'upper' when every letter of ``tokens`` has that case, else None."""
    letters = [ch for t in tokens for ch in t if ch.isalpha()]
    if letters and all(ch.islower() for ch in letters):
        return "lower"
    if letters and all(ch.isupper() for ch in letters):
        return "upper"
    return None


def ctc_blank_id(config, tokenizer, source: str = "the model") -> int:
    """The CTC blank of a transformers checkpoint: its config's ``pad_token_id`` (the id its
    CTC loss uses as blank), else its tokenizer's. The ctc family's adapter (greedy) and this
    vocabulary (beam search) must agree, so both ask here. A transducer's config names its
    blank apart (``blank_token_id``, distinct from its pad token): that one wins."""
    blank = getattr(config, "blank_token_id", None)
    if blank is None:
        blank = getattr(config, "pad_token_id", None)
    if blank is None:
        blank = tokenizer.pad_token_id
    if blank is None:
        raise ValueError(f"no CTC blank id for {source}: neither its config nor its tokenizer has a pad_token_id")
    return int(blank)


class TokenizerVocabulary:
    """A transformers CTC tokenizer's vocabulary; ``blank`` is the model's ``pad_token_id``
    (the id its CTC loss uses) and ``size`` its config's ``vocab_size`` (the logits' width,
    which may exceed the tokenizer's own length)."""

    def __init__(self, tokenizer, blank: int, size: int):
        self.tokenizer, self.blank, self.size = tokenizer, int(blank), int(size)
        vocab = tokenizer.get_vocab()
        special = set(tokenizer.all_special_tokens)
        # Special tokens (<pad>, <unk>, <s>) are never spelt by text, so they carry no case.
        self.case = _letter_case(t for t, i in vocab.items() if t not in special and i < self.size)
        self.cased = self.case is None
        # Ids a phrase must not contain: unknown pieces (text outside the vocabulary, as the
        # charset drops characters outside printable ASCII), the blank, and ids beyond the
        # model's output.
        self._drop = {i for i in (tokenizer.unk_token_id, self.blank) if i is not None}
        self._spelt_chars: dict[str, bool] = {}

    @classmethod
    def from_pretrained(cls, source: str) -> "TokenizerVocabulary":
        """From a checkpoint directory (or a cached hub id): its config and tokenizer only."""
        from transformers import AutoConfig, AutoTokenizer

        try:
            config = AutoConfig.from_pretrained(source, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ValueError(f"model.source: cannot load the tokenizer of {source} offline: "
                             f"{str(exc).splitlines()[0]}") from None
        size = getattr(config, "vocab_size", None) or len(tokenizer)
        return cls(tokenizer, ctc_blank_id(config, tokenizer, source), size)

    def fold(self, text: str) -> str:
        return text.lower() if self.case == "lower" else text.upper() if self.case == "upper" else text

    def ctc_ids(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(self.fold(text), add_special_tokens=False)
        return [i for i in ids if self._usable(i)]

    def lm_token_ids(self, text: str) -> list[int]:
        return lm_index(self.ctc_ids(text), self.blank)

    def phrase_token_ids(self, text: str) -> list[int] | None:
        """LM token ids of key phrase ``text`` (folded to the vocabulary's case), None where
        the tokenizer cannot spell it."""
        spelt = phrase_spelling(self.fold(text), self._spells)
        if spelt is None:
            return None
        ids = self.tokenizer.encode(spelt, add_special_tokens=False)
        return phrase_ids(self, ids) if all(self._usable(i) for i in ids) else None

    def _usable(self, i: int) -> bool:
        return i not in self._drop and 0 <= i < self.size

    def _spells(self, ch: str) -> bool:
        if ch not in self._spelt_chars:
            ids = self.tokenizer.encode(ch, add_special_tokens=False)
            self._spelt_chars[ch] = bool(ids) and all(self._usable(i) for i in ids)
        return self._spelt_chars[ch]

    def decode(self, ids) -> str:
        """The tokenizer's own CTC text rule (word delimiter, ``▁``, blank removal) on
        already collapsed ids: ``group_tokens=False``, since the search's tokens are
        collapsed already and a real double letter ("ll") must stay two tokens."""
        return self.tokenizer.decode(list(ids), group_tokens=False)

    def word_roles(self, ids) -> list[str]:
        """Wav2Vec2-style tokenizers separate words with their ``word_delimiter_token``
        (``|``); SentencePiece pieces open a word with ``▁``."""
        delimiter = getattr(self.tokenizer, "word_delimiter_token", None)
        roles = []
        for piece in self.tokenizer.convert_ids_to_tokens(list(ids)):
            piece = piece or ""
            if piece in (delimiter, " ", "▁"):
                roles.append(SEPARATOR)
            elif piece.startswith(("▁", " ")):
                roles.append(WORD_START)
            else:
                roles.append(CONTINUES)
        return roles


def embedded_vocabulary(model_config=None) -> CharsetVocabulary:
    return CharsetVocabulary()


def is_ctc_checkpoint(spec) -> bool:
    """Whether ``spec`` is a transformers CTC or transducer checkpoint (a directory, or a
    hub id in the local cache, whose config names a ``...ForCTC``, ``...ForRNNT`` or
    ``...ForTDT`` architecture): build-lm then spells text with its vocabulary, whose LM
    tokens are the non-blank tokens in order."""
    import json

    path = Path(spec)
    if path.is_dir():
        try:
            archs = json.loads((path / "config.json").read_text()).get("architectures") or []
        except (OSError, ValueError):
            return False
    elif path.exists() or path.suffix == ".json":   # a tokenizer.json file
        return False
    else:
        try:
            from transformers import AutoConfig

            archs = AutoConfig.from_pretrained(str(spec), local_files_only=True).architectures or []
        except Exception:  # noqa: BLE001 - not a cached model: build-lm tries its other readers
            return False
    return any(str(a).endswith(("ForCTC", "ForRNNT", "ForTDT")) for a in archs)
