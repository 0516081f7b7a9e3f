"""The whisper family's preflight: its options against what the checkpoint offers
(languages, tasks, timestamp tokens, alignment heads), and the CTC draft head against the
encoder it reads. Reads config files only, never weights."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelError
from ..preflight import checkpoint_json

# The generation config of the embedded model (tiny.en): English-only.
EMBEDDED_GENERATION = {"is_multilingual": False, "no_timestamps_token_id": 50362, "alignment_heads": [[1, 0]]}

# The config.json values of the shipped models that are converted at first load (the
# CTranslate2 packages hold no config.json of transformers' kind): what a CTC head is
# checked against.
SHIPPED_CONFIG = {"embedded-base": {"d_model": 512, "encoder_layers": 6, "num_mel_bins": 80, "vocab_size": 51865}}


def shipped_generation(source: str) -> dict:
    """The generation config of a model shipped with the family: tiny.en's (English-only)
    for ``embedded``; for ``embedded-base`` the multilingual one its package's files name
    (languages, tasks, <|notimestamps|>, alignment heads), ModelError where the packages
    are missing."""
    if source == "embedded":
        return EMBEDDED_GENERATION
    from .loader import ct2_generation, embedded_base_files

    side_dir, _ = embedded_base_files()
    try:
        return ct2_generation(side_dir)
    except (OSError, KeyError, ValueError) as exc:
        raise ModelError(f"model.source={source}: its package's config.json / tokenizer.json cannot be read "
                         f"({type(exc).__name__}: {exc})") from None


def check(model_config, config: dict | None) -> None:
    """``config``: the checkpoint's config.json, None for a shipped model (``embedded``,
    ``embedded-base``)."""
    from ...device import check_dtype

    try:
        for key in ("encoder_dtype", "cross_kv_dtype"):
            if getattr(model_config, key) not in (None, "auto"):
                check_dtype(model_config.device, getattr(model_config, key), f"model.{key}")
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if model_config.family != "whisper":   # the ctc family's embedded model: its CTC output only
        return
    if config is None:
        _whisper_options(model_config, shipped_generation(model_config.source))
        if model_config.source in SHIPPED_CONFIG:
            _ctc_head(model_config, SHIPPED_CONFIG[model_config.source])
        return
    _whisper_components(model_config, config)
    _whisper_options(model_config, checkpoint_json(model_config.source, "generation_config.json"))


# The encoder the embedded CTC head was trained on (Whisper tiny.en): config.json values.
TINY_EN = {"d_model": 384, "encoder_layers": 4, "num_mel_bins": 80, "vocab_size": 51864}


def _whisper_options(model_config, generation: dict | None) -> None:
    """model.language / task / timestamps / word_timestamps against what the checkpoint's
    generation config offers (``embedded`` is tiny.en: English-only; ``embedded-base`` is
    multilingual: languages, auto, translate)."""
    from .prompting import WhisperTokens, options_error

    gen = generation or {}
    tokens = WhisperTokens(sot=0, eot=0, no_timestamps=gen.get("no_timestamps_token_id"), prev=None,
                           lang_to_id={k.strip("<|>"): v for k, v in (gen.get("lang_to_id") or {}).items()},
                           task_to_id=gen.get("task_to_id") or {}, multilingual=bool(gen.get("is_multilingual")))
    problem = options_error(tokens, model_config.language, model_config.task, model_config.timestamps,
                            getattr(model_config, "language_candidates", None))
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
    _ctc_head(model_config, config)


def _ctc_head(model_config, config: dict) -> None:
    """A CTC head reads the encoder's states: its width must be the model's, and the
    embedded head fits the encoder it was trained on (tiny.en) only."""
    if not model_config.ctc_head:
        return
    from .ctc_head import CONFIG_FILE, EMBEDDED, embedded_head_dir

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
