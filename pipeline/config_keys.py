"""Every config key with its type, default and comment, read from the config dataclasses
(their field annotations, defaults and the comments beside them in the source), for
`shardscribe keys` and the CLI's help."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from dataclasses import dataclass


@dataclass
class Key:
    key: str
    type: str
    default: str
    comment: str
    owner: str = ""     # who brings the section or key (a decoder kind, a model family)


def _comments(cls) -> dict[str, str]:
    """Field name -> its comment: the one on its line, else the lines just above it."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = lines[node.lineno - 1]
            text = line.split("#", 1)[1].strip() if "#" in line else ""
            above, i = [], node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip()[1:].strip())
                i -= 1
            out[node.target.id] = " ".join(above + ([text] if text else []))
    return out


def _type_name(tp) -> str:
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _keys(prefix: str, cls, owner: str = "", skip: tuple = ()) -> list[Key]:
    hints = typing.get_type_hints(cls)
    comments = _comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        out.append(Key(f"{prefix}.{f.name}", _type_name(hints[f.name]), repr(default).replace("'", ""),
                       comments.get(f.name, ""), owner))
    return out


def config_keys() -> list[Key]:
    from .config import JobConfig
    from .config_sections import ModelConfig, default_kind
    from .kinds import DECODER_KINDS
    from .models import FAMILIES
    from .models.registry import option_classes

    hints = typing.get_type_hints(JobConfig)
    out = [Key("name", "str", default_kind(), "the config's name, shown in the console and the summary")]
    out += _keys("model", ModelConfig, skip=("options",))
    for cls in option_classes():
        owners = [f.name for f in FAMILIES.values() if cls in f.option_classes()]
        out += _keys("model", cls, owner=f"model.family={'|'.join(owners)}")
    for f in dataclasses.fields(JobConfig):
        if f.name not in ("name", "model", "sections"):
            out += _keys(f.name, hints[f.name])
    for kind in DECODER_KINDS.values():
        if kind.options is not None:
            out += _keys(kind.config_section, kind.options, owner=f"decoder.kind={kind.name}")
    return out
