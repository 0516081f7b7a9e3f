"""The transducer family: transformers' ``ParakeetForRNNT`` and ``ParakeetForTDT``, the
models "Pushing the Limits of Beam Search Decoding for Transducer-based ASR models"
searches over (ALSD++, AES++: pipeline.decoding.transducer), and the embedded TDT
transducer over the frozen Whisper tiny.en encoder (embedded.py). The adapters
(adapter.py, embedded.py) expose the projected encoder frames, a predictor step that
carries its state and the joint (token and, for TDT, duration log-probs); transformers'
own ``generate`` is greedy only.

``model.source``: ``embedded`` (the shipped TDT transducer), ``embedded_rnnt`` (its RNN-T
twin, for AES++), a ``train-transducer`` output directory, or a Parakeet directory /
Hugging Face id in the local cache.
"""
from __future__ import annotations

from ..base import TRANSDUCER
from ..registry import ModelFamily, register_family


def load(model_config, device: str, dtype):
    from .embedded import EMBEDDED, EMBEDDED_RNNT, is_embedded_transducer_dir

    if model_config.source in (EMBEDDED, EMBEDDED_RNNT) or is_embedded_transducer_dir(model_config.source):
        from .embedded import load_embedded_transducer_adapter

        return load_embedded_transducer_adapter(model_config.source, device=device, dtype=dtype,
                                                cache_dir=model_config.cache_dir)
    from .adapter import load_transducer_adapter

    return load_transducer_adapter(model_config.source, device=device, dtype=dtype)


def check_components(model_config) -> None:
    """A Parakeet checkpoint's feature extractor and tokenizer load (preflight; ModelError
    if not). The shipped transducers and train-transducer outputs carry their own: known
    by their config's architecture too, since a checkpoint at a URL is checked on a copy
    of its configs without the weights file."""
    from ..preflight import checkpoint_json
    from .embedded import (ARCHITECTURE, CONFIG_FILE, EMBEDDED, EMBEDDED_RNNT,
                           is_embedded_transducer_dir)

    source = model_config.source
    if source in (EMBEDDED, EMBEDDED_RNNT) or is_embedded_transducer_dir(source):
        return
    if ARCHITECTURE in ((checkpoint_json(source, CONFIG_FILE) or {}).get("architectures") or []):
        return
    from .adapter import load_processing

    load_processing(model_config.source)


# transformers' ParakeetForRNNT / ParakeetForTDT ("Pushing the Limits of Beam Search Decoding
# for Transducer-based ASR models"): encoder frames, predictor step and joint; and the
# embedded TDT over Whisper tiny.en. Parakeet's frames are 80 ms (30 s: 375 frames), the
# embedded one's 40 ms (30 s: 750): priced at the finer, as the ctc family does.
FAMILY = register_family(ModelFamily(
    "transducer", "shardscribe.pipeline.models.transducer",
    capabilities=lambda m: frozenset({TRANSDUCER}),
    max_segment_s=30.0, max_segment_cost=750,
    hint=lambda cap: "use --config transducer_greedy or transducer_beam" if cap != TRANSDUCER else "",
    architectures=("ParakeetForRNNT", "ParakeetForTDT", "ShardscribeWhisperTDT"),
    model_types=("parakeet_rnnt", "parakeet_tdt"), has_embedded=True, shipped=("embedded_rnnt",),
    components="shardscribe.pipeline.models.transducer:check_components"))
