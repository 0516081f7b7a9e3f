"""Model actor: prepared rows -> output rows. Loads the model once in __init__.

Runs on the GPU when the config's device resolves to CUDA, else on CPU. Usable with Ray
Data (`map_batches(Transcriber, compute=ActorPoolStrategy(...))`) or in-process.
"""
from __future__ import annotations

import pyarrow as pa

from pipeline.config import config_from_dict, resolve_device, torch_dtype
from pipeline.records import OUTPUT_SCHEMA, prepared_rows, table
from pipeline.transcribe import ARSegmentDecoder, transcribe_prepared


def build_segment_decoder(cfg):
    import torch

    from pipeline.models.whisper_adapter import load_whisper_adapter

    if cfg.model.num_threads:
        torch.set_num_threads(cfg.model.num_threads)
    device = resolve_device(cfg.model.device)
    adapter = load_whisper_adapter(cfg.model.source, device=device,
                                   dtype=torch_dtype(cfg.model.dtype), cache_dir=cfg.model.cache_dir)
    if cfg.decoder.kind == "ar":
        return ARSegmentDecoder(adapter, cfg.decoder.max_new_tokens)
    raise ValueError(f"decoder.kind {cfg.decoder.kind!r} is not available")


class Transcriber:
    def __init__(self, config: dict):
        self.cfg = config_from_dict(config)
        self.decoder = build_segment_decoder(self.cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = transcribe_prepared(prepared_rows(batch), self.decoder, self.cfg.batching.max_tokens)
        return table(rows, OUTPUT_SCHEMA)
