"""What an online token map ("Model-free Speculative Decoding for Transformer-based ASR with
Token Map Drafting", Algorithm 1 built online: pipeline.decoding.drafting.token_map_online) drafts on
a job's own text, for the job's summary.

The model processes that decode keep their maps to themselves (one per process, and with
Ray on other machines), so the figures are replayed in the driver from what the job
committed: its segments' transcripts, in the order they were finished, tokenised with the
model's own tokenizer, decoded in batches of the job's segments per decoder call (its
token budget over one segment's cost, at most ``batching.recordings_per_batch``), each
batch learned once decided. The replay (pipeline.decoding.drafting.token_map_replay,
the bench's) gives exactly the passes, drafts and acceptance a single model process with
no drafting policy would make on that text, hence the map's size and the bound of its
drafting: ``pass_ratio``, AR's decoder passes over drafting's, is the decoder-time speedup
drafting would reach if a pass over candidate trees cost no more than a one-token step.
``always_right_pass_ratio`` is the same for a map that always proposes the right
continuation. At most ``REPORT_MAX_SEGMENTS`` segments are replayed (the first finished).
"""
from __future__ import annotations

REPORT_MAX_SEGMENTS = 20_000   # bounds the driver's replay (~0.5 s of CPU per thousand segments)


def online_map_report(tokens: list[list[int]], cfg, batch: int, limit: int, eot: int, base=None) -> dict:
    """The online map's replay over ``tokens`` (segments in decoding order, end-of-text
    excluded) in batches of ``batch``, with the config's map keys (section token_map)."""
    from ...decoding.drafting.drafters import TokenMapDrafter
    from ...decoding.drafting.token_map_online import OnlineTokenMap, replay_online
    from ...decoding.drafting.token_map_replay import oracle

    tm = cfg.token_map
    online = OnlineTokenMap(max_len=tm.max_draft, max_keys=tm.online_max_keys, base=base)
    counts = replay_online(tokens, TokenMapDrafter(online, tm.candidates, tm.max_draft), batch, limit, eot)
    right = oracle(tokens, tm.max_draft, batch, limit, eot)
    rounds = counts.tm_rounds
    return {"replayed_segments": len(tokens), "batch": batch, "map": online.stats(),
            "drafting_rounds": rounds, "drafted": counts.tm_drafted, "accepted": counts.tm_accepted,
            "drafted_per_round": counts.tm_drafted / rounds if rounds else 0.0,
            "accepted_per_round": counts.tm_accepted / rounds if rounds else 0.0,
            "pass_ratio": counts.pass_ratio, "row_pass_ratio": counts.row_pass_ratio,
            "always_right_pass_ratio": right.pass_ratio}


def job_segments(dst: str, options: dict | None = None, limit: int = REPORT_MAX_SEGMENTS) -> list[str]:
    """The texts of DST's segments, the rows in the order they were finished (the parts'
    order among rows finished together), at most ``limit``: the first ``limit`` rows
    finished are kept while the output is read, so the driver never holds more."""
    import heapq

    from ...output import iter_output

    first: list = []     # a max-heap on (finished_at, read order) of the earliest rows
    order = 0
    for batch in iter_output(dst, ["segments", "finished_at"], options):
        for r in batch:
            order += 1
            item = (-(r["finished_at"] or 0.0), -order,
                    [s["text"] or "" for s in r["segments"] or [] if not s.get("error")])
            if len(first) < limit:
                heapq.heappush(first, item)
            elif item > first[0]:
                heapq.heapreplace(first, item)
    rows = sorted(first, reverse=True)
    return [text for _, _, texts in rows for text in texts][:limit]


def job_report(dst: str, cfg) -> dict:
    """The summary's ``token_map_online`` entry for a job written to ``dst`` with ``cfg``
    (the model loaded on the CPU for its tokenizer)."""
    from dataclasses import replace

    from ...audio import SAMPLE_RATE
    from ...decoding.drafting.token_map import TokenMap
    from ...models import load_model

    texts = job_segments(dst, cfg.storage.options)
    adapter = load_model(replace(cfg.model, device="cpu"))
    tokens = [adapter.tokenize(t) if t.strip() else [] for t in texts]
    per_call = cfg.batching.max_tokens // max(1, adapter.segment_cost(int(cfg.audio.max_segment_s * SAMPLE_RATE)))
    batch = max(1, min(cfg.batching.recordings_per_batch, per_call))
    base = TokenMap.load(cfg.decoder.token_map) if cfg.decoder.token_map is not None else None
    return online_map_report(tokens, cfg, batch, cfg.decoder.max_new_tokens, adapter.eot_id, base)


def summary_entry(dst: str, cfg) -> dict:
    """:func:`job_report`, or what stopped it: the figures must not fail a job whose rows
    are all committed."""
    import logging

    try:
        return job_report(dst, cfg)
    except Exception as exc:  # noqa: BLE001 - a statistic, reported as missing with its reason
        logging.getLogger("shardscribe").exception("the online token map's report failed")
        return {"error": f"{type(exc).__name__}: {exc}"}
