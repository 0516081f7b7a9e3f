"""Typed, validated job configuration: YAML files in conf/ plus `--set key=value` overrides.

A JobConfig is the job's own sections (pipeline.config_sections) plus the sections the
registered decoder kinds bring (``pipeline.kinds``: ``cfg.ssd``, ``cfg.beam``, ...), and
its ``model`` section holds the common keys plus the model family's own
(``pipeline.models``). All validation happens here, before Ray or any model starts: an
unknown key, a value of the wrong type or out of range raises ConfigError naming the
dotted key.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .config_sections import (RAY_TASK_CPUS, AudioConfig, BatchingConfig, ConfidenceConfig, DecoderConfig,
                              FiltersConfig, ModelConfig, OutputConfig, PseudoLabelConfig, RayConfig,
                              SecondStageConfig, StorageConfig, default_family, default_kind)
from .config_values import ConfigError, build, choice, coerce, merge, safe_yaml, takes_text
from .models.base import PACKABLE

__all__ = ["ConfigError", "JobConfig", "ModelConfig", "FiltersConfig", "config_from_dict", "config_hash",
           "load_config", "parse_override", "resolve_config_path"]

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _option_sections() -> dict[str, type]:
    from .kinds import registry

    from . import kinds  # noqa: F401  (registers the built-in kinds)
    return registry.option_sections()


def _families():
    from .models import FAMILIES

    return FAMILIES


@dataclass
class JobConfig:
    name: str = field(default_factory=default_kind)   # a config of the defaults is named after its kind
    model: ModelConfig = field(default_factory=ModelConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    pseudo_label: PseudoLabelConfig = field(default_factory=PseudoLabelConfig)
    second_stage: SecondStageConfig = field(default_factory=SecondStageConfig)
    # The registered decoder kinds' option sections, by section name (cfg.ssd, cfg.beam, ...)
    sections: dict = field(default_factory=lambda: {name: cls() for name, cls in _option_sections().items()})

    def __getattr__(self, name: str):
        # Called only where normal lookup fails: a decoder kind's section.
        sections = self.__dict__.get("sections") or {}
        if name in sections:
            return sections[name]
        raise AttributeError(name)

    def validate(self) -> "JobConfig":
        """Check every section, then the decoder kind and the model family against their
        registries: the capabilities the kind needs, window packing, the segment length."""
        from .kinds import DECODER_KINDS

        for name, value in self._sections():
            if hasattr(value, "validate"):
                value.validate(name)
        choice("decoder.kind", self.decoder.kind, tuple(DECODER_KINDS))
        kind, family = DECODER_KINDS[self.decoder.kind], _families()[self.model.family]
        offered = family.capabilities(self.model)
        for need in sorted(kind.needs_for(self)):
            if need not in offered:
                hint = family.hint(need)
                raise ConfigError(f"model: decoder.kind={kind.name} needs a model with {need}; "
                                  f"model.family={family.name} {'(' + hint + ')' if hint else 'has none'}")
        if hasattr(self.model.options, "check_job"):
            self.model.options.check_job(self, kind, DECODER_KINDS)
        # Options one kind brings and another's job reads (the token map) are checked
        # whichever kind the job runs.
        for owner in DECODER_KINDS.values():
            owner.check_against(self, kind)
        if kind.check_config is not None:
            kind.check_config(self)
        if self.decoder.pack_windows:
            if not kind.packs_windows:
                packing = ", ".join(n for n, k in DECODER_KINDS.items() if k.packs_windows)
                raise ConfigError(f"decoder.pack_windows: only {packing} read the encoder states alone; "
                                  f"decoder.kind={kind.name} needs one clip per window")
            if PACKABLE not in offered:
                hint = family.hint(PACKABLE)
                raise ConfigError(f"decoder.pack_windows: model.family={family.name} cannot pack encoder windows"
                                  + (f" ({hint})" if hint else ""))
        if self.batching.max_tokens < family.max_segment_cost:
            raise ConfigError(f"batching.max_tokens: must be >= {family.max_segment_cost} (one segment of "
                              f"model.family={family.name}), got {self.batching.max_tokens}")
        if self.audio.max_segment_s > family.max_segment_s:
            raise ConfigError(f"audio.max_segment_s: model.family={family.name} reads at most "
                              f"{family.max_segment_s:g} s, got {self.audio.max_segment_s}")
        r = self.ray
        if r.num_cpus is not None and r.address is None:
            pools = r.cpus().pools
            if pools + RAY_TASK_CPUS > r.num_cpus:
                # Ray would start the actors it can and wait for the rest, or for a CPU for
                # its own tasks, for ever.
                raise ConfigError(f"ray.num_cpus: the actor pools need {pools:g} CPUs "
                                  f"(ray.*_actors x ray.*_actor_cpus) and Ray's tasks {RAY_TASK_CPUS} more, "
                                  f"got {r.num_cpus}")
        return self

    def _sections(self):
        """(name, section) for the job's own sections, then the decoder kinds'."""
        for f in dataclasses.fields(self):
            if f.name not in ("name", "sections"):
                yield f.name, getattr(self, f.name)
        yield from self.sections.items()

    def to_dict(self) -> dict:
        """Plain nested dicts, the model's family options flattened into ``model``."""
        out = {"name": self.name}
        for name, value in self._sections():
            data = dataclasses.asdict(value)
            if name == "model":
                data.update(data.pop("options") or {})
            out[name] = data
        return out


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if cls is not None else set()


def _build_model(data, key: str = "model") -> ModelConfig:
    """The model section: the common keys, then the family's own (its options dataclass).
    A key of another family's options at that family's default is dropped (a config that
    restates a default, or that another family's config extends); set to anything else it
    is refused, naming who has it."""
    from .models.registry import option_classes, option_default

    if not isinstance(data, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(data).__name__}")
    core_names = _fields(ModelConfig) - {"options"}
    model = build(ModelConfig, {k: v for k, v in data.items() if k in core_names}, key)
    families = _families()
    choice(f"{key}.family", model.family, tuple(families))
    cls = families[model.family].options_class(model.source)
    own = _fields(cls)
    mine = {}
    for name, value in data.items():
        if name in core_names:
            continue
        if name in own:
            mine[name] = value
            continue
        owners = [c for c in option_classes() if name in _fields(c)]
        if not owners:
            raise ConfigError(f"{key}.{name}: unknown key (known: {', '.join(sorted(core_names | own))})")
        if value != option_default(name)[1]:
            raise ConfigError(f"{key}.{name}: only {getattr(owners[0], 'OWNERS', owners[0].__name__)} have it, "
                              f"model.family={model.family}")
    model.options = build(cls, mine, key) if cls is not None else None
    return model


def _build_job(data: dict) -> JobConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping, got {type(data).__name__}")
    sections = _option_sections()
    hints = typing.get_type_hints(JobConfig)
    own = _fields(JobConfig) - {"sections"}
    unknown = sorted(set(data) - own - set(sections))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key (known: {', '.join(sorted(own | set(sections)))})")
    kwargs = {}
    for name, value in data.items():
        if name == "model":
            kwargs[name] = _build_model(value or {})
        elif name == "name":
            kwargs[name] = coerce("name", value, str)
        elif name in own:
            kwargs[name] = build(hints[name], value or {}, name)
    kwargs["sections"] = {name: build(cls, data.get(name) or {}, name) for name, cls in sections.items()}
    return JobConfig(**kwargs)


def shipped_configs() -> dict[str, str]:
    """The configs in conf/: name -> the first sentence of its leading comment."""
    out = {}
    for path in sorted(CONF_DIR.glob("*.yaml")):
        lines = [ln[1:].strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("#")]
        text = " ".join(lines)
        out[path.stem] = text.split(". ")[0].rstrip(".") + "." if text else ""
    return out


def resolve_config_path(name_or_path: str | None) -> Path:
    """A config file: a path, or the name of one in conf/ (``ctc-beam`` is ``ctc_beam``)."""
    if not name_or_path:
        return CONF_DIR / "default.yaml"
    path = Path(name_or_path)
    if path.is_file():
        return path
    for name in (name_or_path, name_or_path.replace("-", "_")):
        candidate = CONF_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
        if candidate.exists():
            return candidate
    raise ConfigError(f"config: no such file {name_or_path!r}, and no such shipped config "
                      f"({', '.join(shipped_configs())}; `shardscribe configs` describes them)")


def _read_yaml(path: Path, seen: tuple = ()) -> dict:
    try:
        data = safe_yaml(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', None) or type(exc).__name__}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    base = data.pop("extends", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected one config name or path, got {type(base).__name__}")
    if base:
        # The parent is looked for beside the file that names it first (conf/ssd.yaml's
        # "ar" is conf/ar.yaml whatever the working directory holds).
        beside = path.parent / (base if base.endswith(".yaml") else f"{base}.yaml")
        base_path = beside if beside.is_file() else resolve_config_path(base)
        if base_path in seen:
            raise ConfigError(f"{path}: extends: cycle through {base_path}")
        data = merge(_read_yaml(base_path, seen + (path,)), data)
    return data


_NULLS = ("null", "Null", "NULL", "~")


def parse_override(item: str, data: dict | None = None) -> tuple[list[str], object]:
    """``key=value`` as a key path and a value: taken as written where the key is declared
    a string (``--set model.initial_prompt="Names: Anna, Brno."``; null for an optional
    one), else parsed as YAML (numbers, booleans, lists, maps). ``data``: the config so far,
    whose model family decides the type of a family's key."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set {item!r}: empty key")
    path = key.strip().split(".")
    tp = _declared_type(path, data or {})
    if tp is not None and takes_text(tp):
        optional = tp is not str
        return path, None if optional and raw.strip() in _NULLS else raw
    try:
        value = safe_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        # One line, and not the value itself: it may be a password (storage.options).
        raise ConfigError(f"--set {key.strip()}: cannot parse the value as YAML "
                          f"({getattr(exc, 'problem', None) or type(exc).__name__})") from None
    return path, value


def _declared_type(path: list[str], data: dict):
    """The annotation of config key ``path`` (None where it is not a declared field)."""
    if len(path) == 1:
        return typing.get_type_hints(JobConfig).get(path[0]) if path[0] != "sections" else None
    if len(path) != 2:
        return None
    section, name = path
    if section == "model":
        model = data.get("model") if isinstance(data.get("model"), dict) else {}
        family = _families().get(model.get("family", default_family()))
        classes = [ModelConfig] + ([family.options_class(model.get("source", "embedded"))] if family else [])
    else:
        hints = typing.get_type_hints(JobConfig)
        classes = [hints.get(section) if section != "sections" else None, _option_sections().get(section)]
    for cls in classes:
        if cls is not None and dataclasses.is_dataclass(cls) and name in _fields(cls):
            return typing.get_type_hints(cls)[name]
    return None


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None,
                model: str | None = None) -> JobConfig:
    """Load a YAML config (following ``extends:``) over the dataclass defaults, apply
    ``model`` (a checkpoint, :func:`use_model`), then ``key=value`` overrides, validate.
    The defaults live only in the dataclasses; starting from them lets an override reach
    into a mapping the YAML does not restate
    (``--set ssd.presets.high_rtfx.gate_verify_tau=null``)."""
    data = _over_defaults(_read_yaml(resolve_config_path(name_or_path)))
    if model:
        _use_model_storage(model, _storage_options(data, overrides or []))
        allow = _allow_download(data, overrides or [])
        use_model(data, model, allow_download=allow)
        fitting = _config_for_model(data) if name_or_path is None else None
        if fitting is not None:
            # The default config does not fit this model (its family says which does).
            data = _over_defaults(_read_yaml(resolve_config_path(fitting)))
            use_model(data, model, allow_download=allow)
    overridden = set()
    for item in overrides or []:
        path, value = parse_override(item, data)
        overridden.add(".".join(path))
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
        node[path[-1]] = value
    _drop_inherited_model_keys(data, overridden)
    ray = data.get("ray")
    if isinstance(ray, dict) and ray.get("address") is None and os.environ.get("RAY_ADDRESS"):
        # Ray's convention: `ray job submit` and cluster shells name the cluster this way.
        ray["address"] = os.environ["RAY_ADDRESS"]
    cfg = _build_job(data).validate()
    _use_model_storage(cfg.model.source, cfg.storage.options)
    return cfg


def _has_key(model: dict, name: str) -> bool:
    """Whether the family and source ``model`` names take key ``name``."""
    family = _families().get(model.get("family"))
    return family is not None and name in _fields(family.options_class(model.get("source")))


def _model_keys() -> list[str]:
    """The model keys whose value belongs to one model (``ModelFamily.model_keys``)."""
    return sorted({key for family in _families().values() for key in family.model_keys})


def _drop_inherited_model_keys(data: dict, overridden: set) -> None:
    """A named config's value of a key that belongs to one model (Whisper's CTC head,
    ``ctc_head: embedded`` in ssd, ctc_greedy, ctc_beam: ``ModelFamily.model_keys``)
    belongs to the model it names: where ``--set`` moves the job to a model without that
    key (``model.family=granite_speech``, a ``ctc`` checkpoint), the value is dropped, as
    ``--model`` drops it (:func:`use_model`). A value set with ``--set`` stays, for the
    model section to refuse."""
    model = data.get("model")
    if not isinstance(model, dict):
        return
    for key in _model_keys():
        if f"model.{key}" in overridden:
            continue
        if {"model.family", "model.source"} & overridden and not _has_key(model, key):
            model[key] = None


def _allow_download(data: dict, overrides: list[str]) -> bool:
    """model.allow_download as the config and its overrides set it: --model reads the
    checkpoint's config.json before the overrides are applied."""
    value = (data.get("model") or {}).get("allow_download", False) if isinstance(data.get("model"), dict) else False
    for item in overrides:
        path, parsed = parse_override(item, data)
        if path == ["model", "allow_download"]:
            value = parsed
    return value is True


def _storage_options(data: dict, overrides: list[str]) -> dict:
    """storage.options as the config and its overrides set them, validated: --model reads a
    checkpoint URL's config.json before the overrides are applied."""
    import copy

    probe = {"storage": copy.deepcopy(data.get("storage") or {})}
    for item in overrides:
        path, value = parse_override(item, data)
        if path[:2] != ["storage", "options"]:
            continue
        node = probe
        for part in path[:-1]:   # a part that is no mapping is left to the overrides proper to refuse
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[path[-1]] = value
    storage = StorageConfig(options=probe["storage"].get("options") or {})
    storage.validate("storage")
    return storage.options


def _use_model_storage(source: str, options: dict) -> None:
    """A checkpoint URL's storage options made fsspec's defaults for its protocol, here and
    in the processes this one starts, as the job does for its input and output
    (pipeline.storage.use_options): the driver reads the checkpoint's configs with them,
    and every worker fetches its weights with them. A URL that carries credentials is
    refused: the config is copied into logs and the output folder."""
    from .models.remote import is_remote
    from .storage import redact_uri, use_options

    if not is_remote(source):
        return
    if redact_uri(source) != source:
        raise ConfigError(f"model.source={redact_uri(source)}: the URL carries a user:password@ part or a query "
                          "string; credentials come from the standard chains (environment, profile files, "
                          "instance metadata), not from the config")
    use_options(options, [source])


def _config_for_model(data: dict) -> str | None:
    """The shipped config the model ``data`` names runs with when no --config is given,
    where the default does not fit it (``ModelFamily.default_config``); None: the default."""
    model = data.get("model") or {}
    family = _families().get(model.get("family"))
    return family.config_for(model.get("source")) if family is not None else None


def use_model(data: dict, source: str, allow_download: bool = False) -> None:
    """Point the config at checkpoint ``source`` (``--model``): its family from the
    checkpoint's architecture (pipeline.models.preflight.family_of_checkpoint), no value of
    a key that belongs to another model (``ModelFamily.model_keys``: Whisper's CTC head) on
    a model without the key or on another shipped model, and no window packing where the
    family cannot pack, so a named config (``--config ctc_beam``) runs its decoder kind on
    any model that can."""
    from .models.preflight import family_of_checkpoint, shipped_model

    named = shipped_model(source)
    try:
        family, source = named or (family_of_checkpoint(source, allow_download), source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data.get("model"), dict):   # "model:" left empty in the YAML: the defaults
        data["model"] = {}
    model = data["model"]
    model.update(source=source, family=family)
    for key in _model_keys():
        # The value fits the model the config named (the embedded head reads tiny.en's
        # encoder): no other shipped model takes it.
        if not _has_key(model, key) or (named and source != "embedded"):
            model[key] = None
    if PACKABLE not in _families()[family].capabilities(_build_model(model)):
        data["decoder"]["pack_windows"] = False


def _over_defaults(data: dict) -> dict:
    """``data`` merged over the dataclass defaults, except that each entry of a mapping an
    options dataclass declares in REPLACED_WHOLE (an SSD preset) is taken whole from the
    YAML: an entry that leaves out a key must not inherit it from the default entry of the
    same name."""
    merged = merge(JobConfig().to_dict(), data)
    for dotted in sorted(_declared("REPLACED_WHOLE")[0]):
        section, key = dotted.split(".")
        given = data[section].get(key) if isinstance(data.get(section), dict) else None
        if isinstance(given, dict) and isinstance(merged.get(section, {}).get(key), dict):
            merged[section][key].update(given)
    return merged


def config_from_dict(data: dict) -> JobConfig:
    """Rebuild a JobConfig shipped to a worker as a plain dict (validated again)."""
    return _build_job(data).validate()


# Keys that change how a job runs but not what it writes (where and how fast it runs,
# where checkpoints are cached): a rerun that changes only these is the same config.
# How rows are grouped into files, how long a read may stall before it is an error and
# how the storage is reached belong here too: a resume that raises the read timeout for a
# slow mount, or moves to another endpoint, is the same job. An options dataclass adds its
# own as EXECUTION_KEYS (field names).
_EXECUTION_KEYS = {"name", "ray", "batching", "model.cache_dir", "model.allow_download", "model.num_threads", "model.device", "model.compile",
                   "pseudo_label", "output", "storage", "audio.read_timeout_s", "audio.piece_s", "second_stage"}


# Keys naming files whose content decides transcripts: config_hash covers what they hold.
# An options dataclass adds its own as FILE_KEYS.
_FILE_KEYS = ("model.source", "decoder.token_map", "confidence.calibration")


def _declared(attr: str) -> tuple[set, list]:
    """The option classes' ``attr`` keys as dotted names, and the model's option classes."""
    from .models.registry import option_classes

    model_classes = option_classes()
    keys = {f"model.{k}" for c in model_classes for k in getattr(c, attr, ())}
    sections = {**{f.name: typing.get_type_hints(JobConfig)[f.name] for f in dataclasses.fields(JobConfig)
                   if f.name not in ("name", "model", "sections")}, **_option_sections()}
    keys |= {f"{s}.{k}" for s, c in sections.items() for k in getattr(c, attr, ())}
    return keys, model_classes


def config_hash(cfg: JobConfig) -> str:
    """A short stable id of what decides a job's transcripts: the config without the
    execution-only keys, with what its file references hold (pipeline.file_fingerprint),
    as canonical JSON, hashed (SHA-256, first 12 hex digits). The model section holds every
    registered family's keys (at their defaults where the family has none), so a model
    hashes the same whichever families are registered beside its own."""
    import hashlib
    import json

    text = json.dumps(hashed_config(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def config_differences(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(dotted key, old value, new value) for each key two ``hashed_config`` mappings
    disagree on, in key order."""
    out = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [(f"{section}.{k}", a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            out.append((section, a, b))
    return out


def hashed_config(cfg: JobConfig) -> dict:
    """What ``config_hash`` hashes: the config's sections without the execution-only keys,
    ``<key>@content`` beside each file reference, as plain JSON values."""
    import json

    from .file_fingerprint import fingerprint

    execution, model_classes = _declared("EXECUTION_KEYS")
    execution |= _EXECUTION_KEYS
    # Keys added after outputs were written: hashed only once set off their default, so the
    # rows a config wrote before a key existed still match it.
    if_set = _declared("HASHED_WHEN_SET")[0]
    defaults = JobConfig().to_dict()
    files = sorted(_declared("FILE_KEYS")[0] | set(_FILE_KEYS))

    def strip(node: dict, prefix: str) -> dict:
        out = {}
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if dotted in execution or (dotted in if_set and value == defaults.get(prefix[:-1], {}).get(key)):
                continue
            out[key] = strip(value, dotted + ".") if isinstance(value, dict) and prefix == "" else value
        return out

    data = cfg.to_dict()
    for cls in model_classes:
        data["model"] = {**{k: v for k, v in dataclasses.asdict(cls()).items()}, **data["model"]}
    stripped = strip(data, "")
    for cls in model_classes:
        if hasattr(cls, "canonical"):
            cls.canonical(stripped["model"])
    for dotted in files:
        section, key = dotted.split(".")
        value = stripped.get(section, {}).get(key)
        if isinstance(value, str) and value != "embedded":
            stripped[section][f"{key}@content"] = fingerprint(value, cfg.storage.options)
    return json.loads(json.dumps(stripped, sort_keys=True, default=str))
