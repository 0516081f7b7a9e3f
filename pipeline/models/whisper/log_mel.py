"""Whisper's log-mel features computed on the model's device, a batch at a time.

The same arithmetic as transformers' WhisperFeatureExtractor (its torch path): each clip
zero-padded to the 30-s window, a periodic Hann-windowed STFT (n_fft 400, hop 160,
centred, reflect-padded), the power spectrum of every frame but the last, the
extractor's own mel filter bank, log10 clamped at 1e-10, floored at 8 below the clip's
maximum, then (x + 4) / 4. What changes is where it runs: the padded samples go to the
device once (from pinned host memory, without blocking, where the device is CUDA) and
the spectrogram is computed there, so the host neither runs the STFT nor copies 3000
frames per clip back and forth.

Only the frames a batch's audio reaches are transformed: a frame whose window holds
nothing but the window's zero padding has zero power, so its log is exactly
log10(1e-10) = -10 before the floor, and it is written as that instead of computed (a
batch of 4-s clips transforms about 4.4 s of its 30-s windows). The batch's samples are
cut at the first hop boundary at least one FFT length past its longest clip, so every
frame computed sees the same samples, reflected end included, as in the whole window.

On the CPU the result equals the extractor's to float32 rounding (tests/test_log_mel.py
states the bounds); on a GPU its FFT rounds differently, within the same bounds.
"""
from __future__ import annotations

import numpy as np
import torch


class DeviceLogMel:
    """``features(audios) -> [B, mel bins, frames]`` on ``device`` in ``dtype``, for the
    settings of ``feature_extractor`` (a WhisperFeatureExtractor)."""

    def __init__(self, feature_extractor, device: torch.device | str, dtype: torch.dtype = torch.float32):
        self.device = torch.device(device)
        self.dtype = dtype
        self.n_fft = int(feature_extractor.n_fft)
        self.hop = int(feature_extractor.hop_length)
        self.n_samples = int(feature_extractor.n_samples)
        self.window = torch.hann_window(self.n_fft, device=self.device)
        self.filters = torch.from_numpy(np.asarray(feature_extractor.mel_filters, dtype=np.float32)).T \
            .contiguous().to(self.device)
        self.pinned = self.device.type == "cuda"
        self._host: torch.Tensor | None = None
        self._copied = None   # the CUDA event of the last copy out of the host buffer

    @staticmethod
    def supports(feature_extractor) -> bool:
        """Whether ``feature_extractor`` is one this class reproduces (no dithering, no
        per-clip normalisation, the attributes it reads)."""
        needed = ("n_fft", "hop_length", "n_samples", "mel_filters")
        return (all(hasattr(feature_extractor, a) for a in needed)
                and not getattr(feature_extractor, "dither", 0.0)
                and not getattr(feature_extractor, "do_normalize", False))

    def span(self, longest: int) -> int:
        """Samples of the window a batch whose longest clip has ``longest`` samples needs
        transformed (a multiple of the hop, or the whole window)."""
        need = -(-(min(longest, self.n_samples) + self.n_fft) // self.hop) * self.hop
        return need if need + self.n_fft < self.n_samples else self.n_samples

    def _host_buffer(self, rows: int, width: int) -> torch.Tensor:
        """A zeroed [rows, window] float32 host tensor, pinned on CUDA and reused: pinning
        costs more than the copy it speeds up, so the buffer is kept, and grown when a
        batch needs more rows. A reused buffer waits for its last copy to finish first."""
        if not self.pinned:
            return torch.zeros(rows, width, dtype=torch.float32)
        if self._copied is not None:
            self._copied.synchronize()
        if self._host is None or self._host.numel() < rows * width:
            self._host = torch.empty(rows * width, dtype=torch.float32).pin_memory()
        host = self._host[:rows * width].view(rows, width)
        host.zero_()
        return host

    def samples(self, audios: list[np.ndarray]) -> torch.Tensor:
        """The clips zero-padded (or cut) to the batch's span of the window
        (:meth:`span`), on the device: [B, span]."""
        clips = [np.asarray(a, dtype=np.float32)[:self.n_samples] for a in audios]
        host = self._host_buffer(len(clips), self.span(max(len(a) for a in clips)))
        view = host.numpy()   # the same memory: copies from read-only arrays (Arrow's) too
        for i, a in enumerate(clips):
            view[i, :len(a)] = a
        if not self.pinned:
            return host if self.device.type == "cpu" else host.to(self.device)
        out = host.to(self.device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return out

    @torch.inference_mode()
    def __call__(self, audios: list[np.ndarray]) -> torch.Tensor:
        wave = self.samples(audios)
        frames = self.n_samples // self.hop
        stft = torch.stft(wave, self.n_fft, self.hop, window=self.window, return_complex=True)
        power = (stft[..., :frames].abs() ** 2).contiguous()
        computed = torch.clamp(self.filters @ power, min=1e-10).log10()
        if computed.shape[2] < frames:
            log_spec = computed.new_full((*computed.shape[:2], frames), -10.0)
            log_spec[:, :, :computed.shape[2]] = computed
        else:
            log_spec = computed
        peak = log_spec.amax(dim=(1, 2), keepdim=True)
        log_spec = torch.maximum(log_spec, peak - 8.0)
        return ((log_spec + 4.0) / 4.0).to(self.dtype)
