"""The transducer beam kind's preflight: AES++ ("Pushing the Limits of Beam Search Decoding
for Transducer-based ASR models", Algorithm 2) is defined for RNN-T, so a TDT checkpoint
under ``transducer.algorithm=aes`` is refused before any worker starts."""
from __future__ import annotations

from ...models.errors import ModelError
from ...models.preflight import checkpoint_config


def check_search(cfg) -> None:
    """AES++ is defined for RNN-T: under ``transducer.algorithm=aes`` a TDT (a checkpoint
    with token durations) is one line here instead of an error from every beam worker."""
    if cfg.transducer.algorithm != "aes":
        return
    from ...models.transducer.embedded import shipped_or_path

    source = cfg.model.source
    # a shipped name becomes its directory; the hub cache is the one the loader reads
    # (model.cache_dir is ours, not the hub's)
    config = checkpoint_config(str(shipped_or_path(source)))
    if config.get("durations"):
        raise ModelError(f"transducer.algorithm=aes: AES++ searches RNN-T models, and model.source={source} is "
                         f"a TDT (durations {list(config['durations'])}); use transducer.algorithm=alsd, or "
                         "model.source=embedded_rnnt (the shipped RNN-T)")
