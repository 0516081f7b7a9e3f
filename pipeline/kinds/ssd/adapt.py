"""In-job adaptation of the CTC draft head (``ssd.adapt``).

"Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts" gains only where its
CTC draft (eq. 3) agrees with the decoder's greedy text (eq. 5); a head trained on other
speech rarely does. Every job already produces what a draft needs: the decoder's own
transcripts of the corpus at hand. So a model actor decodes its first slice of audio
(``ssd.adapt_audio_minutes``) as plain greedy AR, keeps each segment's encoder states with
the AR text, fits the head on them in place (pipeline.models.whisper.ctc_head_fit, the
loop `train-draft-head` uses, within ``ssd.adapt_fit_minutes``), and drafts with it from
then on. The head is written to ``ssd.adapt_dir`` (the job sets
``DST/__shardscribe__/draft_head`` there), and a model actor that finds a head in that
folder drafts with it at once: a rerun, a resumed job or a later actor never adapts again.

Exactness is SSD's own: verified and fallback rows are greedy AR's text whichever head
drafted them; only drafts the entropy gate accepts unverified depend on the head.
"""
from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...filters import compression_ratio

if TYPE_CHECKING:
    from ...models.base import CTCModel

log = logging.getLogger(__name__)

# Segments whose AR text repeats itself this much are not learnt (Whisper's own
# failed-decode test: compression ratio above 2.4).
MAX_COMPRESSION_RATIO = 2.4


@dataclass
class AdaptStats:
    rows: int = 0                  # segments learnt from
    audio_s: float = 0.0           # their audio
    fit_s: float = 0.0             # seconds the fitting took
    reused: bool = False           # a head already in adapt_dir: no slice, no fitting
    error: str | None = None       # the fitting or the save failed: drafting kept the old head


class HeadAdaptation:
    """The slice, the fit and the swap for one model actor's adapter (its ``ctc_head``)."""

    def __init__(self, adapter: CTCModel, audio_minutes: float, fit_minutes: float, save_dir: str | None,
                 epochs: int = 12, lr: float = 2e-4, seed: int = 0):
        self.adapter = adapter
        self.audio_s_target = 60.0 * audio_minutes
        self.fit_minutes = fit_minutes
        self.save_dir = save_dir
        self.epochs, self.lr, self.seed = epochs, lr, seed
        self.stats = AdaptStats()
        self._rows: list[dict] = []
        self.done = False
        if save_dir and self._load_saved():
            self.done = self.stats.reused = True

    @property
    def collecting(self) -> bool:
        return not self.done

    def _load_saved(self) -> bool:
        from ...models.whisper.ctc_head import WEIGHTS_FILE, load_ctc_head
        from ...storage import url_to_fs

        fs, path = url_to_fs(self.save_dir)
        if not fs.exists(f"{path}/{WEIGHTS_FILE}"):
            return False
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            fs.get(f"{path}/", f"{tmp}/", recursive=True)
            head = load_ctc_head(tmp)
        self._install(head)
        log.info("ssd.adapt: drafting with the head adapted earlier in %s", self.save_dir)
        return True

    def _install(self, head) -> None:
        old = self.adapter.ctc_head
        ref = next(old.parameters())
        self.adapter.ctc_head = head.to(device=ref.device, dtype=ref.dtype).eval()

    def observe(self, states: torch.Tensor, valid_frames: torch.Tensor, texts: list[str],
                audio_seconds: float) -> None:
        """One batch of the slice: ``states[k, :valid_frames[k]]`` with its AR text."""
        if self.done:
            return
        lengths = valid_frames.tolist()
        for k, text in enumerate(texts):
            text = text.strip()
            if text and compression_ratio(text) <= MAX_COMPRESSION_RATIO:
                self._rows.append({"states": states[k, :int(lengths[k])].to("cpu", torch.float16).clone(),
                                   "text": text})
        self.stats.audio_s += audio_seconds
        if self.stats.audio_s >= self.audio_s_target:
            self.fit()

    def fit(self) -> None:
        """Fit a copy of the current head on the slice, install it, save it; on any failure
        the job keeps drafting with the head it had (the slice's rows are already final)."""
        from ...models.whisper.ctc_head_fit import FitOptions, fit_ctc_head

        self.done = True
        rows, self._rows = self._rows, []
        self.stats.rows = len(rows)
        if not rows:
            return
        t0 = time.perf_counter()
        try:
            head = copy.deepcopy(self.adapter.ctc_head).float().train()
            device = str(next(head.parameters()).device)
            fit_ctc_head(head, [r | {"states": r["states"].float()} for r in rows], [],
                         FitOptions(epochs=self.epochs, lr=self.lr, seed=self.seed, device=device,
                                    max_minutes=self.fit_minutes, stop_within_epoch=True, log_every=0),
                         log=log.info)
            self._install(head)
            self.stats.fit_s = time.perf_counter() - t0
            if self.save_dir:
                self._save(head)
        except Exception as exc:    # adaptation is an optimisation: never fail the job for it
            self.stats.error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("ssd.adapt: kept the previous head: %s", self.stats.error)
        log.info("ssd.adapt: fitted on %d segments (%.1f min of audio) in %.1f min", self.stats.rows,
                 self.stats.audio_s / 60, self.stats.fit_s / 60)

    def _save(self, head) -> None:
        """Written under a temporary name, then moved into place, so a reader never
        loads half a head; another actor's head may replace it (either is a fit of the
        same corpus)."""
        import tempfile

        from ...models.whisper.ctc_head import save_ctc_head
        from ...storage import url_to_fs

        fs, path = url_to_fs(self.save_dir)
        with tempfile.TemporaryDirectory() as tmp:
            save_ctc_head(head, tmp, extra={"adapted_on_segments": self.stats.rows,
                                            "adapted_on_audio_minutes": round(self.stats.audio_s / 60, 2),
                                            "fit_minutes": round(self.stats.fit_s / 60, 2),
                                            "adapted_at": time.time()})
            staging = f"{path}.tmp-{np.random.default_rng().integers(1 << 30)}"
            fs.makedirs(staging, exist_ok=True)
            fs.put(f"{tmp}/", f"{staging}/", recursive=True)
            if fs.exists(path):
                fs.rm(path, recursive=True)
            fs.mv(staging, path, recursive=True)


def summary_entry(adapt_dir: str, started_at: float) -> dict:
    """The job summary's ``ssd_adapt``: where the head is, what it was fitted on, and
    whether this run fitted it or found it there; never fails the job (a statistic)."""
    import json

    from ...models.whisper.ctc_head import CONFIG_FILE
    from ...storage import redact_uri, url_to_fs

    try:
        fs, path = url_to_fs(adapt_dir)
        if not fs.exists(f"{path}/{CONFIG_FILE}"):
            return {"dir": redact_uri(adapt_dir), "head": None}
        with fs.open(f"{path}/{CONFIG_FILE}", "r") as fh:
            card = json.load(fh)
        return {"dir": redact_uri(adapt_dir), "segments": card.get("adapted_on_segments"),
                "audio_minutes": card.get("adapted_on_audio_minutes"), "fit_minutes": card.get("fit_minutes"),
                "fitted_by_this_run": float(card.get("adapted_at", 0.0)) >= started_at}
    except Exception as exc:  # noqa: BLE001 - reported as missing, with its reason
        return {"dir": redact_uri(adapt_dir), "error": f"{type(exc).__name__}: {exc}"[:300]}
