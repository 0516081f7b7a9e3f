"""One runner's loop over prepared batches: the model stage, and for a two-stage decoder
kind the pooled second stage ("Self-Speculative Decoding for LLM-based ASR with CTC
Encoder Drafts" §3.2: sort by length, batch the fallback by a token budget), in one
process that holds the model once.

Both runners drive it: the in-process runner over the whole input, the Ray model actor
(actors.model_worker) over each work unit it is given. A two-stage kind's pending rows
wait in a buffer across batches (pipeline.pending_pool, ``second_stage.*``) until a
token-budget batch of them is full, the input ends, one has waited
``second_stage.max_wait_s`` or the buffer holds ``second_stage.max_pending_segments``
(then it is decoded before the next batch), or, in the slow start's batches but its last,
after each of them (trigger ``start``); rows with nothing pending are emitted at once, a
pending row only once finished.

A long recording arrives in pieces (pipeline.prepare_stream); each is decoded as a row of
its own and held, as text, until its recording's last piece is done (pipeline.pieces):
only whole rows are emitted, and ``on_progress`` gets the pieces' audio seconds and
shares as they finish.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from ..pipeline.batching import in_slow_start
from ..pipeline.confidence.apply import ConfidenceScorer
from ..pipeline.filters import mark_rows
from ..pipeline.pending_pool import PendingPool, SecondStageStats
from ..pipeline.pieces import PieceJoiner
from ..pipeline.records import OUTPUT_SCHEMA, stamp, table


class StageLoop:
    """``model``: an actors.transcriber.Transcriber; ``second``: an actors.finisher.Finisher
    sharing its model (None for a one-stage kind); ``stats``: where the second stage's
    calls are counted. The pool lives as long as the loop: the batches of several
    :meth:`steps` calls (a Ray model actor's work units) share it, and :meth:`finish`
    decodes what it still holds. ``on_progress(counts)``: the progress of the pieces of
    long recordings, (rows, audio seconds, errors, partial recordings) to add."""

    def __init__(self, model, second, cfg, stats: SecondStageStats | None = None, on_progress=None):
        self.model, self.second, self.cfg = model, second, cfg
        self.on_progress = on_progress
        self.joiner = PieceJoiner(self._refinish)
        self.stats = stats if stats is not None or second is None else SecondStageStats(cfg.batching.max_tokens)
        self.pending_rows = 0    # rows that went to the second stage
        opts = cfg.second_stage
        self.pool = PendingPool(cfg.batching.max_tokens, opts.max_wait_s, opts.max_pending_segments) \
            if second is not None and opts.pooled else None
        self.held: dict[int, dict] = {}     # pooled rows by key, their pending states as objects
        self._keys = itertools.count()

    @property
    def holds(self) -> int:
        """Rows waiting in the pool for their second stage."""
        return len(self.held)

    def steps(self, prepared: Iterable[tuple[int, pa.Table]], emit: Callable[[pa.Table], None],
              first_batch: int | None = None) -> Iterator[None]:
        """Run ``prepared``: (input rows the batch read, its prepared table) pairs, in input
        order; ``emit(table)`` gets every finished OUTPUT table. Yields after each batch
        (the caller's chance to report). ``first_batch``: the slow start's first piece
        (batching.first_batch) where these batches are a job's (or a worker's) first. Rows
        still pooled at the end stay pooled (:meth:`finish`)."""
        second, cfg, opts = self.second, self.cfg, self.cfg.second_stage
        step = cfg.batching.recordings_per_batch
        first = first_batch or step
        pool = self.pool
        read = 0
        emit = self._joining(emit)
        for rows_read, batch in prepared:
            read += rows_read
            batch = self.joiner.tag(batch)
            if second is None:
                emit(self.model(batch))
                yield
                continue
            # The pending segments' states go to the second stage as objects: no table,
            # no packed bytes, between two stages of one process.
            out = self.model.rows(batch, pending_as_bytes=False)
            done = [r for r in out if not r.get("pending_index")]
            pending = [r for r in out if r.get("pending_index")]
            self.pending_rows += len(pending)
            if pool is None:
                emit(second.finish_rows(out, self.stats, "block"))
                yield
                continue
            for row, costs in zip(pending, second.price_rows(pending)):
                key = next(self._keys)
                self.held[key] = row
                pool.add(key, costs)
            if done:
                emit(table(done, OUTPUT_SCHEMA))
            # Full batches; all of it once a row has waited max_wait_s, or once the buffer
            # reaches its bound. The slow start's rows are finished batch by batch, not
            # held for a full budget: a job whose first rows all go to the second stage
            # would show none of them until the budget fills or max_wait_s passes.
            self._dispatch(pool.take(drain=pool.segments >= opts.max_pending_segments,
                                     start=in_slow_start(read, first, step)), emit)
            yield

    def finish(self, emit: Callable[[pa.Table], None]) -> None:
        """The input is done: decode every row the pool still holds."""
        if self.pool is not None:
            self._dispatch(self.pool.take(final=True), self._joining(emit))

    def _joining(self, emit: Callable[[pa.Table], None]) -> Callable[[pa.Table], None]:
        """``emit`` of whole rows: a long recording's pieces are held until its last."""
        def whole(out: pa.Table) -> None:
            rows, counts = self.joiner.join(out)
            if any(counts) and self.on_progress is not None:
                self.on_progress(counts)
            if rows is not None and rows.num_rows:
                emit(rows)
        return whole

    def _refinish(self, row: dict) -> dict:
        """A joined recording's row, finished as its pieces' rows were: confidence over all
        its words, the filters, the stamp."""
        stage = self.second if self.second is not None else self.model
        confidence: ConfidenceScorer | None = getattr(stage, "confidence", None)
        if confidence is not None:
            confidence.fill_row(row)
        mark_rows([row], stage.cfg.filters)
        return stamp([row], stage.config_hash)[0]

    def _dispatch(self, batches, emit) -> None:
        for b in batches:
            self.stats.record_waits(b.waits)
            emit(self.second.finish_rows([self.held.pop(k) for k in b.keys], self.stats, b.trigger))
