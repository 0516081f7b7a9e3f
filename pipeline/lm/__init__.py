"""Language models for shallow fusion: KenLM-built token n-grams as dense GPU tensors
(NGPU-LM), the ARPA reader, phrase boosting trees and the KenLM reference."""

from pathlib import Path

# The NGPU-LM tensors a build-lm output directory holds; decoders load this file.
TENSORS_NAME = "lm.ngpu.safetensors"


def lm_tensors_path(path: str | Path) -> Path:
    """The tensors file ``beam.lm_path`` names: a build-lm output directory's, or the file itself."""
    p = Path(path)
    return p / TENSORS_NAME if p.is_dir() else p
