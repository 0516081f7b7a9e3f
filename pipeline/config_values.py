"""Typed config values: the error every config check raises and the coercion of YAML and
``--set`` values into a section dataclass's declared types.

A leaf module (no project imports), so a decoder kind's or a model family's options can
validate themselves without importing the job config that collects them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from pathlib import Path

import yaml

# A config is a few kilobytes; a bound keeps a hostile file from costing parse time.
MAX_YAML_BYTES = 1 << 20
# Numbers in YAML 1.2's float syntax, which PyYAML (YAML 1.1) reads as strings: 1e12, 1E-3, .5
_NUMBER = re.compile(r"[-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: nested aliases expand exponentially (a "billion laughs" file of
    a kilobyte reaches gigabytes), and a config never needs them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a config",
                                              event.start_mark)
        return super().compose_node(parent, index)


def safe_yaml(text: str):
    """Parse ``text`` as YAML with no aliases, at most MAX_YAML_BYTES (yaml.YAMLError if not)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_YAML_BYTES:
        raise yaml.YAMLError(f"larger than {MAX_YAML_BYTES} bytes")
    return yaml.load(text, Loader=_NoAliasLoader)


def takes_text(tp) -> bool:
    """Whether annotation ``tp`` is str or str | None: a ``--set`` value for it is taken as
    written, not parsed as YAML."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner == [str]
    return tp is str


class ConfigError(ValueError):
    """A bad configuration: the message names the offending key."""


def choice(key, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, allowed))}, got {value!r}")


def at_least(key, value, low):
    if value < low:
        raise ConfigError(f"{key}: must be >= {low}, got {value!r}")


def coerce(key: str, value, tp):
    """Check ``value`` against the annotation ``tp`` (int/float/str/bool/Optional)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        # The first type the value fits ("auto" or a number for an int | str key).
        for tp_ in inner[:-1]:
            try:
                return coerce(key, value, tp_)
            except ConfigError:
                pass
        return coerce(key, value, inner[-1])
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            value = float(value.replace("_", ""))
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            value = float(value.replace("_", ""))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{key}: {value!r} is not a valid value (a finite number is)")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


def build(cls, data: dict, prefix: str):
    """An instance of dataclass ``cls`` from ``data``, every value checked against its
    field's type; an unknown key is an error naming it and the known ones."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{key}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, value or {}, key)
        else:
            kwargs[name] = coerce(key, value, tp)
    return cls(**kwargs)


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def flat_keys(mapping: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in mapping.items():
        name = f"{prefix}{k}"
        keys.append(name)
        if isinstance(v, dict):
            keys += flat_keys(v, name + ".")
    return keys


def check_text_file(key: str, path: str) -> None:
    """A file the workers read as UTF-8 text can be: otherwise each would stop the job."""
    try:
        Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{key}: {path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path} ({exc.strerror or type(exc).__name__})") from None


def check_token_map(key: str, path: str) -> None:
    """A readable token map: the file exists and its safetensors header says so (cheap: the
    header alone is read)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{key}: {path} does not exist")
    try:
        with open(p, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size)) if 0 < size < 1 << 24 else {}
    except (OSError, ValueError):
        header = {}
    if "order" not in (header.get("__metadata__") or {}):
        raise ConfigError(f"{key}: {path} is not a token map (build one with shardscribe build-token-map)")
