"""The job runner, config loading, confidence and the output folder name no decoder kind and
no model family: what is particular to one lives in its registry entry
(pipeline.kinds.registry, pipeline.models.registry), so a new kind or family changes
none of these files.

Each file is read as Python tokens without its comments and docstrings; a registered name
counts where it is an identifier (``cfg.ssd``, ``from pipeline.kinds.ar import ...``)
or a string literal, whole or as one part of a dotted key (``"ssd"``, ``"ar:ar"``,
``"shardscribe.pipeline.models.whisper:load"``). Prose in messages (``"a transducer model"``) and
longer identifiers (``transducer_words``, ``arrow``) do not count.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from conftest import ROOT

# Where no kind or family may be named: the job runner, config loading, confidence, output.
SCANNED = ("actors/job/*.py", "pipeline/config*.py", "pipeline/confidence/**/*.py", "pipeline/output.py",
           "pipeline/output/**/*.py")

# A string made of identifiers joined by ".", ":" or "=": a module path, a config key, a
# calibration key; a registered name is one of its parts.
_KEY = re.compile(r"[A-Za-z_]\w*(?:[.:=][A-Za-z_]\w*)+")
_STATEMENT_START = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)


def _literal_names(text: str) -> set[str]:
    return set(re.split(r"[.:=]", text)) if _KEY.fullmatch(text) else {text}


def named(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each place ``source`` names one of ``names`` outside its comments
    and docstrings (any statement that is a lone string)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL)]
    hits = []
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string in names:
            hits.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING:
            before = tokens[i - 1].type if i else tokenize.NEWLINE
            after = tokens[i + 1].type if i + 1 < len(tokens) else tokenize.ENDMARKER
            if before in _STATEMENT_START and after in (tokenize.NEWLINE, tokenize.ENDMARKER):
                continue    # a docstring
            # An f-string's parts: its literal text and the expressions inside it.
            for node in ast.walk(ast.parse(tok.string.strip(), mode="eval")):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    hits += [(tok.start[0], repr(node.value)) for _ in _literal_names(node.value) & names]
                elif isinstance(node, ast.Name) and node.id in names:
                    hits.append((tok.start[0], node.id))
                elif isinstance(node, ast.Attribute) and node.attr in names:
                    hits.append((tok.start[0], "." + node.attr))
    return hits


def _registered_names() -> set[str]:
    from shardscribe.pipeline.kinds import DECODER_KINDS
    from shardscribe.pipeline.models import FAMILIES

    return set(DECODER_KINDS) | set(FAMILIES)


def _scanned_files() -> list[Path]:
    return sorted({p for pattern in SCANNED for p in ROOT.glob(pattern)})


def test_the_runner_config_confidence_and_output_name_no_kind_or_family():
    names = _registered_names()
    assert {"ar", "ssd", "audit", "whisper"} <= names
    files = _scanned_files()
    assert ROOT / "actors/job/run.py" in files and ROOT / "pipeline/config.py" in files
    assert any("confidence" in p.parts for p in files) and any("output" in p.parts for p in files)
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files for line, what in named(p.read_text(), names)]
    assert not found, ("a decoder kind or model family is named outside its registry entry (give the kind or "
                       "family a hook: pipeline.kinds.registry, pipeline.models.registry): " + "; ".join(found))


@pytest.mark.parametrize("source, expected", [
    ('if cfg.decoder.kind == "audit":\n    pass\n', [(1, "'audit'")]),
    ("x = cfg.ssd.adapt_dir\n", [(1, "ssd")]),
    ("from pipeline.kinds.ar import map_drafting_key\n", [(1, "ar")]),
    ('cal = word.get("ar:ar")\n', [(1, "'ar:ar'")]),
    ('family = model.get("family", "whisper")\n', [(1, "'whisper'")]),
    ('msg = f"{cfg.ssd.preset} preset"\n', [(1, ".ssd")]),
    ('REF = "shardscribe.pipeline.kinds.ssd.job:prepare_job"\n', [(1, "'shardscribe.pipeline.kinds.ssd.job:prepare_job'")]),
])
def test_the_scan_finds_a_named_kind_or_family(source, expected):
    """The check can fail: each way of naming a kind or family is reported."""
    assert named(source, {"ar", "audit", "ssd", "whisper"}) == expected


def test_the_scan_ignores_comments_docstrings_prose_and_longer_names():
    source = ('"""The ar kind and ssd, in a docstring."""\n'
              "def f(arrow, transducer_words):\n"
              '    """audit: named in a docstring."""\n'
              "    # ssd in a comment\n"
              '    raise ValueError("an ssd job with a whisper model")\n'
              '    return arrow, transducer_words, "search", "ar_fallback", "model.ctc_head"\n')
    assert named(source, {"ar", "audit", "ssd", "whisper", "transducer", "ctc"}) == []
