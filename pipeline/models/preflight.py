"""Checks of the model config that need the machine or the files, run in the driver before
any worker starts, so that a missing checkpoint, an absent GPU or a component the model
lacks is one line naming the key instead of a traceback from every worker.

Cheap on purpose: config files and torch's device count are read, no weights are loaded.
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import ModelError
from .remote import (cache_root, download_checkpoint, fetch_checkpoint, is_remote, list_checkpoint,
                     read_member)
from ..storage import redact_uri


def check_device(device: str) -> None:
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        build = torch.__version__
        raise ModelError(f"model.device={device}: no CUDA device is usable here (torch {build}"
                         f"{', a CPU-only build' if torch.version.cuda is None else ''}); "
                         "use model.device=cpu or auto")
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ModelError(f"model.device={device}: only {torch.cuda.device_count()} CUDA device(s) here")


def checkpoint_json(source: str, name: str) -> dict | None:
    """Another JSON file of a checkpoint (a directory, a URL, or a hub id in the local
    cache); None where it has none."""
    if is_remote(source):
        text = read_member(source, name)
        return json.loads(text) if text is not None else None
    path = Path(source).expanduser()
    if path.is_dir():
        return json.loads((path / name).read_text()) if (path / name).is_file() else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, name)
    return json.loads(Path(cached).read_text()) if isinstance(cached, str) else None


def shipped_model(name: str) -> tuple[str, str] | None:
    """(family, model.source) of a shipped model's short name (``--model tiny.en``, ``base``);
    None for any other name. A local directory of that name wins over the short name."""
    from .registry import FAMILIES

    if Path(name).expanduser().is_dir():
        return None
    for family in FAMILIES.values():
        for short, source in family.names:
            if name == short:
                return family.name, source
    return None


def fetch_hint(source: str) -> str:
    """How to get hub id ``source`` into the local cache: what a refusal ends with."""
    return (f"rerun with --allow-download (model.allow_download=true) to download it, or fetch it first where "
            f"the hub is reachable: hf download {source} (huggingface-cli download {source})")


def checkpoint_config(source: str, cache_dir: str | None = None, allow_download: bool = False) -> dict:
    """The ``config.json`` of a checkpoint directory, of a checkpoint folder at a URL (read
    remotely, that file alone) or of a hub id in the local Hugging Face cache (jobs read
    models offline unless ``allow_download``: then a hub id not in the cache is downloaded
    first); ModelError when there is none."""
    if is_remote(source):
        list_checkpoint(source)   # one line for a URL with nothing there, or no config.json
        return _config_mapping(redact_uri(source), read_member(source, "config.json") or "")
    path = Path(source).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelError(f"model.source={source}: the directory has no config.json (not a "
                             "transformers checkpoint)")
        return _config_mapping(source, config.read_text())
    if path.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1 or path.exists():
        raise ModelError(f"model.source={source}: no such directory")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json", cache_dir=cache_dir)
    if not isinstance(cached, str) and allow_download:
        download_checkpoint(source, cache_dir)
        cached = try_to_load_from_cache(source, "config.json", cache_dir=cache_dir)
    if not isinstance(cached, str):
        if allow_download:
            raise ModelError(f"model.source={source}: downloaded, but the repository has no config.json "
                             "(not a transformers checkpoint)")
        raise ModelError(f"model.source={source}: not a local directory, and not in the local "
                         f"Hugging Face cache (nothing is downloaded unless asked); {fetch_hint(source)}")
    return _config_mapping(source, Path(cached).read_text())


def _config_mapping(source: str, text: str) -> dict:
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ModelError(f"model.source={source}: config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ModelError(f"model.source={source}: config.json is not a JSON object")
    return config


# What transformers' from_pretrained reads weights from, whole or sharded.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def check_model(model_config) -> None:
    """Raise ModelError for a device, source or component problem of ``model_config``."""
    from ..device import check_dtype

    from .registry import FAMILIES, model_family

    family = model_family(model_config.family)
    check_device(model_config.device)
    try:
        check_dtype(model_config.device, model_config.dtype, "model.dtype")
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if model_config.source in family.shipped:
        family.check(model_config, None)
        return
    owners = [f for f in FAMILIES.values() if model_config.source in f.shipped]
    if owners:
        raise ModelError(f"model.source={model_config.source}: a model shipped with the {owners[0].name} family; "
                         f"set model.family={owners[0].name}, not {model_config.family}")
    if model_config.source == "embedded":
        if not family.has_embedded:
            raise ModelError(f"model.source=embedded: the {model_config.family} family has no embedded "
                             "model; set model.source to a checkpoint directory")
        family.check(model_config, None)
        return
    if is_remote(model_config.source):
        _check_remote(model_config, family)
        return
    folder = Path(model_config.source).expanduser()
    no_weights = folder.is_dir() and not any((folder / name).is_file() for name in WEIGHT_FILES)
    _check_checkpoint(model_config, family, f"the directory has a config.json but no weights "
                      f"({' or '.join(WEIGHT_FILES[::2])})" if no_weights else None)


def _check_checkpoint(model_config, family, weights_problem: str | None) -> None:
    """A checkpoint's config, options and components; ``weights_problem``: what is wrong
    with its weights (None: nothing), said after what its config says."""
    config = checkpoint_config(model_config.source, allow_download=model_config.allow_download)
    check_family(model_config, config)
    family.check(model_config, config)
    # Last: what the config says is wrong is the more useful message.
    if weights_problem:
        raise ModelError(f"model.source={model_config.source}: {weights_problem}")
    family.check_components(model_config)


def _check_remote(model_config, family) -> None:
    """A checkpoint at a URL, checked as a directory on the copy of its config and tokenizer
    files in this machine's model cache (the weights are listed, never read); messages
    name the URL, not the copy."""
    url = model_config.source
    listing = list_checkpoint(url)
    copy, _ = fetch_checkpoint(url, cache_root(model_config), weights=False, listing=listing)
    try:
        _check_checkpoint(model_config.with_values(source=str(copy)), family, listing.weights_problem())
    except ModelError as exc:
        raise ModelError(str(exc).replace(str(copy), redact_uri(url))) from None


def check_family(model_config, config: dict) -> None:
    """The checkpoint's architecture (or, where its config names none, its model_type)
    against what ``model.family`` loads: a family's loader given another family's checkpoint
    fails only in the workers, or (granite_speech) builds a default-sized random model from
    a config it does not understand."""
    from .registry import FAMILIES, model_family

    family = model_family(model_config.family)
    archs = [str(a) for a in config.get("architectures") or []]
    kind = config.get("model_type")
    if not archs:
        _check_model_type(model_config, family, kind if isinstance(kind, str) else None)
        return
    if not family.architectures or any(family.loads_architecture(a) for a in archs):
        return
    others = [f.name for f in FAMILIES.values() if any(f.loads_architecture(a) for a in archs)]
    hint = (f"; set model.family={others[0]} (or use --model {model_config.source})" if others
            else "; no model family loads it")
    raise ModelError(f"model.source={model_config.source} holds a {', '.join(archs)} checkpoint"
                     f"{f' (model_type {kind})' if kind else ''}; model.family={family.name} loads "
                     f"{', '.join(family.architectures)} checkpoints{hint}")


def _check_model_type(model_config, family, kind: str | None) -> None:
    """A config that names no architecture, judged by its ``model_type``: the key the
    family's loader goes by (``ModelFamily.model_types``)."""
    from .registry import FAMILIES

    if not family.model_types or (kind and family.loads_model_type(kind)) or (kind is None
                                                                             and not family.needs_model_type):
        return
    others = [f.name for f in FAMILIES.values() if kind and f is not family and f.loads_model_type(kind)]
    hint = (f"; set model.family={others[0]}" if others else "; no model family loads it" if kind else "")
    raise ModelError(f"model.source={model_config.source}: its config.json names no architecture and "
                     f"{f'model_type {kind}' if kind else 'no model_type'}; model.family={family.name} loads "
                     f"model_type {', '.join(sorted(family.known_model_types()))}{hint}")


def _checkpoint_config_for_flag(source: str, allow_download: bool = False) -> dict:
    """The checkpoint's config.json for ``--model`` (a local directory, or a Hugging Face id
    in the local cache, downloaded first only with ``allow_download``); ValueError naming
    the flag."""
    try:
        return checkpoint_config(source, allow_download=allow_download)
    except (ModelError, ValueError) as exc:
        shown = redact_uri(source)
        raise ValueError(f"--model: {str(exc).removeprefix(f'model.source={shown}: ')} ({shown})") from None


def family_of_checkpoint(source: str, allow_download: bool = False) -> str:
    """The registered family whose ``architectures`` name the checkpoint's or, for a config
    that names no architecture, whose ``model_types`` hold its model_type."""
    from .registry import FAMILIES

    config = _checkpoint_config_for_flag(source, allow_download)
    archs = [str(a) for a in config.get("architectures") or []]
    kind = config.get("model_type")
    for family in FAMILIES.values():
        if any(family.loads_architecture(arch) for arch in archs):
            return family.name
    if not archs and isinstance(kind, str):
        for family in FAMILIES.values():
            if family.loads_model_type(kind):
                return family.name
    raise ValueError(f"--model: no model family loads {redact_uri(source)} (architectures {archs or 'not named'}, "
                     f"model_type {kind or 'not named'}; known families: {', '.join(sorted(FAMILIES))})")
