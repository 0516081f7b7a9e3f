"""The model errors that the driver's preflight and the families' loaders both raise (a
module of its own so the loaders need not import the preflight, which imports them).
"""
from __future__ import annotations

from pathlib import Path


class ModelError(ValueError):
    """A model, device or source problem: the message names the config key."""


# Files a transformers tokenizer reads its vocabulary from, one of which nearly every
# tokenizer has (tokenizer_config.json alone names a class, not its tokens).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
# Where a feature extractor's settings are: its own file, or inside the processor's.
FEATURE_FILES = ("preprocessor_config.json", "processor_config.json")


def component_error(source: str, what: str, exc: BaseException) -> ModelError:
    """The one-line ModelError for a tokenizer or feature extractor that transformers could
    not load from ``source``. A local directory without the files is named as such:
    transformers' own message for it can mislead ("install sentencepiece or tiktoken", or a
    TypeError about a None path)."""
    folder = Path(source).expanduser()
    wanted = TOKENIZER_FILES if what == "tokenizer" else FEATURE_FILES
    if folder.is_dir() and not any((folder / n).is_file() for n in wanted):
        return ModelError(f"model.source={source}: the checkpoint has no {what} files (none of "
                          f"{', '.join(wanted)})")
    detail = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())[:300]
    return ModelError(f"model.source={source}: cannot load its {what} offline: {type(exc).__name__}: {detail}")


def load_component(loader, source: str, what: str):
    """``loader.from_pretrained(source)`` offline (a transformers tokenizer or feature
    extractor class), its failure raised as :func:`component_error`."""
    try:
        return loader.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise component_error(source, what, exc) from None
