"""Model actor: prepared rows -> output rows. Loads the model once in __init__.

Runs on the GPU when the config's device resolves to CUDA, else on CPU. Usable with Ray
Data (`map_batches(Transcriber, compute=ActorPoolStrategy(...))`) or in-process. For SSD
it is the first pool (encode, draft, gate, verify): its rows carry the segments that
still need AR fallback, with their encoder states, to the SSDFallback pool; for ctc_beam
it emits CTC log-probs for the CTCBeamDecoder pool.
"""
from __future__ import annotations

import pyarrow as pa

from pipeline.config import config_from_dict, resolve_device, torch_dtype
from pipeline.records import INTERMEDIATE_SCHEMA, OUTPUT_SCHEMA, prepared_rows, table
from pipeline.transcribe import (ARSegmentDecoder, CTCGreedySegmentDecoder, SSDFirstPassDecoder,
                                 transcribe_prepared)


# model.encoder_micro_batch's default on CPU (see pipeline.config.ModelConfig).
CPU_ENCODER_MICRO_BATCH = 2


def load_adapter(cfg):
    import torch

    from pipeline.models.whisper_adapter import load_whisper_adapter

    if cfg.model.num_threads:
        torch.set_num_threads(cfg.model.num_threads)
    device = resolve_device(cfg.model.device)
    micro = cfg.model.encoder_micro_batch
    if micro is None:
        micro = CPU_ENCODER_MICRO_BATCH if torch.device(device).type == "cpu" else 0
    return load_whisper_adapter(cfg.model.source, device=device,
                                dtype=torch_dtype(cfg.model.dtype), cache_dir=cfg.model.cache_dir,
                                ctc_head=cfg.model.ctc_head, encoder_micro_batch=micro)


def build_segment_decoder(cfg, adapter=None):
    adapter = adapter or load_adapter(cfg)
    kind = cfg.decoder.kind
    if kind == "ar":
        return ARSegmentDecoder(adapter, cfg.decoder.max_new_tokens)
    if kind == "ctc_greedy":
        return CTCGreedySegmentDecoder(adapter, pack=cfg.decoder.pack_windows)
    if kind == "ssd":
        tau_ctc, tau_slm = cfg.ssd.thresholds()
        return SSDFirstPassDecoder(adapter, tau_ctc, tau_slm, cfg.decoder.max_new_tokens,
                                   reuse_kv=cfg.ssd.reuse_kv, verify_max_entropy=cfg.ssd.verify_max_entropy,
                                   lookahead=cfg.ssd.lookahead, lookahead_rule=cfg.ssd.lookahead_rule,
                                   pack_gate=cfg.ssd.packs_gate(),
                                   gate_verify_tau=cfg.ssd.gate_verify_threshold(),
                                   adaptive_pack_gate=cfg.ssd.adaptive_pack_gate)
    if kind == "ctc_beam":
        from pipeline.beam_stage import CTCLogProbsDecoder

        return CTCLogProbsDecoder(adapter, pack=cfg.decoder.pack_windows)
    raise ValueError(f"decoder.kind {kind!r} is not available")


TWO_STAGE_KINDS = ("ssd", "ctc_beam")


def output_schema(cfg) -> pa.Schema:
    return INTERMEDIATE_SCHEMA if cfg.decoder.kind in TWO_STAGE_KINDS else OUTPUT_SCHEMA


class Transcriber:
    def __init__(self, config: dict):
        self.cfg = config_from_dict(config)
        self.decoder = build_segment_decoder(self.cfg)
        self.schema = output_schema(self.cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = transcribe_prepared(prepared_rows(batch), self.decoder, self.cfg.batching.max_tokens)
        return table(rows, self.schema)
