"""Real English prose from sources that ship offline with a clean licence.

Not a paper algorithm: training text for the CTC draft head (the CTC encoder drafts of
"Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts"). Sources, both
under the Python Software Foundation licence:
- ``pydoc_data.topics``: the Python language reference prose that ``help()`` prints;
- docstrings of the Python standard library modules, read with ``ast`` (nothing imported).
Sentences are kept only when a TTS engine can read them as written and Whisper would write
them the same way: plain words and punctuation, no code, digits, or abbreviations.
"""
from __future__ import annotations

import ast
import os
import re
import sysconfig
from collections import deque
from pathlib import Path

_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_ALLOWED = re.compile(r"^[A-Za-z ,.;:'?!-]+$")
_BAD_WORDS = re.compile(r"\b(e\.g|i\.e|etc|vs|cf|ie|eg)\b|\.\.|--|\s'|'\s|::", re.I)
_PAREN = re.compile(r"\([^()]*\)")


def clean_sentence(raw: str, min_words: int = 4, max_words: int = 24) -> str | None:
    """The sentence as a Whisper-style transcript, or None when unfit for TTS."""
    s = " ".join(_PAREN.sub("", raw).split())
    s = s.replace(" ,", ",").replace(" .", ".")
    if not s or not _ALLOWED.match(s) or _BAD_WORDS.search(s):
        return None
    words = s.split()
    if not (min_words <= len(words) <= max_words):
        return None
    # Identifiers (camelCase, ALLCAPS, single letters other than "a"/"I") read badly.
    for w in words:
        core = w.strip(",.;:'?!-")
        if not core or (len(core) == 1 and core not in ("a", "A", "I")):
            return None
        if core.isupper() and len(core) > 1 or re.search(r"[a-z][A-Z]", core):
            return None
    s = s[0].upper() + s[1:]
    if s[-1] not in ".?!":
        return None
    return s


def sentences_from_prose(text: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", text):
        # Indented blocks in these sources are code samples or grammar rules.
        lines = [ln for ln in para.splitlines() if not ln.startswith(("   ", "\t", ">>>"))]
        flat = " ".join(ln.strip() for ln in lines)
        for raw in _SPLIT.split(flat):
            s = clean_sentence(raw)
            if s:
                out.append(s)
    return out


def pydoc_topic_sentences() -> list[str]:
    import pydoc_data.topics as topics

    out = []
    for key in sorted(topics.topics):
        out.extend(sentences_from_prose(topics.topics[key]))
    return out


def _parse(source: str, attempts: int = 3):
    """``ast.parse``, retried on CPython 3.11.7's transient "AST constructor recursion
    depth mismatch" SystemError: its AST converter keeps that depth in interpreter-wide
    state, which another thread compiling at the same moment (Ray's, in a test process)
    can disturb. The same source parses on the next attempt."""
    for attempt in range(attempts):
        try:
            return ast.parse(source)
        except SystemError:
            if attempt == attempts - 1:
                raise


_NOT_PROSE_DIRS = {"site-packages", "test", "tests", "idle_test"}
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# Only these can have a statement as a child: the walk below never enters an expression,
# which is most of a module's nodes.
_HOLDS_STATEMENTS = (ast.mod, ast.stmt, ast.excepthandler, ast.match_case)


def _documented_nodes(tree: ast.AST):
    """The module, class and function nodes of ``tree`` in ``ast.walk``'s breadth-first
    order (the corpus's sentence order depends on it), visiting statements only."""
    queue = deque([tree])
    while queue:
        node = queue.popleft()
        if isinstance(node, _DOCUMENTED):
            yield node
        queue.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, _HOLDS_STATEMENTS))


def _stdlib_sources(root: Path) -> list[Path]:
    files = []
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _NOT_PROSE_DIRS]
        files += [Path(top, n) for n in names if n.endswith(".py")]
    return sorted(files)


def stdlib_docstring_sentences(max_files: int | None = None) -> list[str]:
    out = []
    for path in _stdlib_sources(Path(sysconfig.get_paths()["stdlib"]))[:max_files]:
        try:
            tree = _parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in _documented_nodes(tree):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                out.extend(sentences_from_prose(doc))
    return out


def prose_sentences() -> dict[str, list[str]]:
    """Deduplicated sentences per source, in a stable order."""
    seen: set[str] = set()
    result = {}
    for name, sents in (("pydoc_topics", pydoc_topic_sentences()),
                        ("stdlib_docstrings", stdlib_docstring_sentences())):
        keep = []
        for s in sents:
            if s.lower() not in seen:
                seen.add(s.lower())
                keep.append(s)
        result[name] = keep
    return result
