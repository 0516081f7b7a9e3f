"""Checks of the model config that need the machine or the files, run in the driver before
any worker starts, so that a missing checkpoint, an absent GPU or a component the model
lacks is one line naming the key instead of a traceback from every worker.

Cheap on purpose: config files and torch's device count are read, no weights are loaded.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.models.errors import ModelError


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
    """Another JSON file of a checkpoint (a directory, or a hub id in the local cache);
    None where it has none."""
    path = Path(source).expanduser()
    if path.is_dir():
        return json.loads((path / name).read_text()) if (path / name).is_file() else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, name)
    return json.loads(Path(cached).read_text()) if isinstance(cached, str) else None


def checkpoint_config(source: str, cache_dir: str | None = None) -> dict:
    """The ``config.json`` of a checkpoint directory or of a hub id in the local Hugging
    Face cache (jobs read models offline); ModelError when there is none."""
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
    if not isinstance(cached, str):
        raise ModelError(f"model.source={source}: not a local directory, and not in the local "
                         "Hugging Face cache (models are read offline: download it where the hub is "
                         "reachable, or point model.source at a checkpoint directory)")
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


# The encoder the embedded CTC head was trained on (Whisper tiny.en): config.json values.
TINY_EN = {"d_model": 384, "encoder_layers": 4, "num_mel_bins": 80, "vocab_size": 51864}


def _whisper_options(model_config, generation: dict | None) -> None:
    """model.language / task / timestamps / word_timestamps against what the checkpoint's
    generation config offers (the embedded model is tiny.en: English-only)."""
    from pipeline.models.whisper.prompting import WhisperTokens, options_error

    gen = generation or {}
    tokens = WhisperTokens(sot=0, eot=0, no_timestamps=gen.get("no_timestamps_token_id"), prev=None,
                           lang_to_id={k.strip("<|>"): v for k, v in (gen.get("lang_to_id") or {}).items()},
                           task_to_id=gen.get("task_to_id") or {}, multilingual=bool(gen.get("is_multilingual")))
    problem = options_error(tokens, model_config.language, model_config.task, model_config.timestamps)
    if problem:
        raise ModelError(f"{problem} (model.source={model_config.source})")
    if model_config.word_timestamps and not gen.get("alignment_heads"):
        raise ModelError(f"model.word_timestamps: model.source={model_config.source} names no alignment_heads in "
                         "its generation_config.json")


def _whisper_components(model_config, config: dict) -> None:
    """The feature extractor must make the mel bins the encoder reads; a CTC head reads
    the encoder's states: its width must be the model's, and the embedded head fits the
    encoder it was trained on (tiny.en) only."""
    # transformers 5 saves the feature extractor inside processor_config.json, older
    # versions beside it as preprocessor_config.json
    features = (checkpoint_json(model_config.source, "preprocessor_config.json")
                or (checkpoint_json(model_config.source, "processor_config.json") or {}).get("feature_extractor")
                or {})
    bins, size = config.get("num_mel_bins"), features.get("feature_size")
    if bins is not None and size is not None and bins != size:
        raise ModelError(f"model.source={model_config.source}: its feature extractor makes {size} mel bins, "
                         f"its encoder reads {bins}")
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
    if model_config.ctc_head == EMBEDDED:
        differs = [k for k, v in TINY_EN.items() if config.get(k) not in (None, v)]
        if differs:
            k = differs[0]
            raise ModelError(f"model.ctc_head=embedded: the embedded CTC head reads Whisper tiny.en's encoder; "
                             f"model.source={model_config.source} is another model ({k} {config[k]}, tiny.en "
                             f"{TINY_EN[k]}); train a head for it (shardscribe train-ctc-head) or use a decoder "
                             "without one (--config ar)")


def check_model(model_config) -> None:
    """Raise ModelError for a device, source or component problem of ``model_config``."""
    from pipeline.device import check_dtype

    check_device(model_config.device)
    try:
        check_dtype(model_config.device, model_config.dtype, "model.dtype")
        for key in ("encoder_dtype", "cross_kv_dtype"):
            if getattr(model_config, key) not in (None, "auto"):
                check_dtype(model_config.device, getattr(model_config, key), f"model.{key}")
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if model_config.source == "embedded_rnnt":
        if model_config.family != "transducer":
            raise ModelError(f"model.source=embedded_rnnt: the shipped RNN-T transducer; set "
                             f"model.family=transducer (--config transducer_beam), not {model_config.family}")
        return
    if model_config.source == "embedded":
        from pipeline.models import model_family

        if not model_family(model_config.family).has_embedded:
            raise ModelError(f"model.source=embedded: the {model_config.family} family has no embedded "
                             "model; set model.source to a checkpoint directory")
        if model_config.family == "whisper":
            _whisper_options(model_config, {"is_multilingual": False, "no_timestamps_token_id": 50362,
                                            "alignment_heads": [[1, 0]]})
        return
    config = checkpoint_config(model_config.source)
    check_family(model_config, config)
    if model_config.family == "whisper":
        _whisper_components(model_config, config)
        _whisper_options(model_config, checkpoint_json(model_config.source, "generation_config.json"))
    # Last: what the config says is wrong is the more useful message.
    folder = Path(model_config.source).expanduser()
    if folder.is_dir() and not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ModelError(f"model.source={model_config.source}: the directory has a config.json but no weights "
                         f"({' or '.join(WEIGHT_FILES[::2])})")
    from pipeline.models import model_family

    model_family(model_config.family).check_components(model_config)


def check_family(model_config, config: dict) -> None:
    """The checkpoint's architecture (or, where its config names none, its model_type)
    against what ``model.family`` loads: a family's loader given another family's checkpoint
    fails only in the workers, or (granite_speech) builds a default-sized random model from
    a config it does not understand."""
    from pipeline.models import FAMILIES, model_family

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
    from pipeline.models import FAMILIES

    if not family.model_types or (kind and family.loads_model_type(kind)) or (kind is None
                                                                             and not family.needs_model_type):
        return
    others = [f.name for f in FAMILIES.values() if kind and f is not family and f.loads_model_type(kind)]
    hint = (f"; set model.family={others[0]}" if others else "; no model family loads it" if kind else "")
    raise ModelError(f"model.source={model_config.source}: its config.json names no architecture and "
                     f"{f'model_type {kind}' if kind else 'no model_type'}; model.family={family.name} loads "
                     f"model_type {', '.join(sorted(family.known_model_types()))}{hint}")


def check_transducer_search(cfg) -> None:
    """AES++ is defined for RNN-T: under ``transducer.algorithm=aes`` a TDT (a checkpoint
    with token durations) is one line here instead of an error from every beam worker."""
    if cfg.decoder.kind != "transducer_beam" or cfg.transducer.algorithm != "aes":
        return
    from pipeline.models.transducer.embedded import shipped_or_path

    source = cfg.model.source
    # a shipped name becomes its directory; the hub cache is the one the loader reads
    # (model.cache_dir is ours, not the hub's)
    config = checkpoint_config(str(shipped_or_path(source)))
    if config.get("durations"):
        raise ModelError(f"transducer.algorithm=aes: AES++ searches RNN-T models, and model.source={source} is "
                         f"a TDT (durations {list(config['durations'])}); use transducer.algorithm=alsd, or "
                         "model.source=embedded_rnnt (the shipped RNN-T)")


def _checkpoint_config_for_flag(source: str) -> dict:
    """The checkpoint's config.json for ``--model`` (a local directory, or a Hugging Face id
    in the local cache: nothing is downloaded); ValueError naming the flag."""
    try:
        return checkpoint_config(source)
    except (ModelError, ValueError) as exc:
        raise ValueError(f"--model: {str(exc).removeprefix(f'model.source={source}: ')} ({source})") from None


def family_of_checkpoint(source: str) -> str:
    """The registered family whose ``architectures`` name the checkpoint's or, for a config
    that names no architecture, whose ``model_types`` hold its model_type."""
    from pipeline.models import FAMILIES

    config = _checkpoint_config_for_flag(source)
    archs = [str(a) for a in config.get("architectures") or []]
    kind = config.get("model_type")
    for family in FAMILIES.values():
        if any(family.loads_architecture(arch) for arch in archs):
            return family.name
    if not archs and isinstance(kind, str):
        for family in FAMILIES.values():
            if family.loads_model_type(kind):
                return family.name
    raise ValueError(f"--model: no model family loads {source} (architectures {archs or 'not named'}, "
                     f"model_type {kind or 'not named'}; known families: {', '.join(sorted(FAMILIES))})")
