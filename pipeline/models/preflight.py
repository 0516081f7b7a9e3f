"""Checks of the model config that need the machine or the files, run in the driver before
any worker starts, so that a missing checkpoint, an absent GPU or a component the model
lacks is one line naming the key instead of a traceback from every worker.

Cheap on purpose: config files and torch's device count are read, no weights are loaded.
"""
from __future__ import annotations

import json
from pathlib import Path


class ModelError(ValueError):
    """A model, device or source problem: the message names the config key."""


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


def checkpoint_config(source: str, cache_dir: str | None = None) -> dict:
    """The ``config.json`` of a checkpoint directory or of a hub id in the local Hugging
    Face cache (jobs read models offline); ModelError when there is none."""
    path = Path(source).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelError(f"model.source={source}: the directory has no config.json (not a "
                             "transformers checkpoint)")
        return json.loads(config.read_text())
    if path.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1 or path.exists():
        raise ModelError(f"model.source={source}: no such directory")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json", cache_dir=cache_dir)
    if not isinstance(cached, str):
        raise ModelError(f"model.source={source}: not a local directory, and not in the local "
                         "Hugging Face cache (models are read offline: download it where the hub is "
                         "reachable, or point model.source at a checkpoint directory)")
    return json.loads(Path(cached).read_text())


def _whisper_components(model_config, config: dict) -> None:
    """A CTC head reads the encoder's states: its width must be the model's."""
    if not model_config.ctc_head:
        return
    from pipeline.models.whisper.ctc_head import CONFIG_FILE, EMBEDDED, embedded_head_dir

    head_dir = embedded_head_dir() if model_config.ctc_head == EMBEDDED else Path(model_config.ctc_head)
    if not (head_dir / CONFIG_FILE).is_file():
        raise ModelError(f"model.ctc_head={model_config.ctc_head}: no {CONFIG_FILE} there")
    head_width = json.loads((head_dir / CONFIG_FILE).read_text()).get("d_model")
    width = config.get("d_model")
    if head_width is not None and width is not None and head_width != width:
        raise ModelError(f"model.ctc_head={model_config.ctc_head}: the head reads {head_width}-wide encoder "
                         f"states, model.source={model_config.source} has {width} (the embedded head fits "
                         "Whisper tiny.en only); train a head for this model or set model.ctc_head=null "
                         "with --config ar")


def check_model(model_config) -> None:
    """Raise ModelError for a device, source or component problem of ``model_config``."""
    from pipeline.device import check_dtype

    check_device(model_config.device)
    try:
        check_dtype(model_config.device, model_config.dtype, "model.dtype")
        if model_config.encoder_dtype:
            check_dtype(model_config.device, model_config.encoder_dtype, "model.encoder_dtype")
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if model_config.source == "embedded":
        from pipeline.models import model_family

        if not model_family(model_config.family).has_embedded:
            raise ModelError(f"model.source=embedded: the {model_config.family} family has no embedded "
                             "model; set model.source to a checkpoint directory")
        return
    config = checkpoint_config(model_config.source)
    if model_config.family == "whisper":
        _whisper_components(model_config, config)


def checkpoint_architectures(source: str) -> list[str]:
    """The ``architectures`` of a checkpoint's config (a local directory, or a Hugging Face
    id in the local cache: nothing is downloaded)."""
    try:
        return list(checkpoint_config(source).get("architectures") or [])
    except (ModelError, ValueError) as exc:
        raise ValueError(f"--model: {str(exc).removeprefix(f'model.source={source}: ')} ({source})") from None


def family_of_checkpoint(source: str) -> str:
    """The registered family whose ``architectures`` name the checkpoint's."""
    from pipeline.models import FAMILIES

    archs = checkpoint_architectures(source)
    for family in FAMILIES.values():
        for arch in archs:
            if any(arch == a or (a.startswith("*") and arch.endswith(a[1:])) for a in family.architectures):
                return family.name
    raise ValueError(f"--model: no model family loads {source} (architectures {archs or 'not named'}; "
                     f"known families: {', '.join(sorted(FAMILIES))})")
