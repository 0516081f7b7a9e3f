"""granite-speech's log-mel input features in plain torch.

transformers' GraniteSpeechFeatureExtractor computes them with torchaudio, whose wheel does
not import with the CPU build of torch this project installs. This is the same computation:
a power mel spectrogram (Hann window of ``win_length`` zero-padded to ``n_fft``, centred
frames with reflect padding, HTK mel filters without normalisation, as torchaudio's
MelSpectrogram defaults), log10 clipped at 1e-10, floored 8 decades below each
utterance's maximum, scaled by 1/4 and shifted by 1, an odd last frame dropped, and pairs
of frames stacked into one feature vector. Like the extractor, a batch is zero-padded to
its longest clip before the spectrogram.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass
class GraniteFeatures:
    sampling_rate: int = 16000
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    n_mels: int = 80

    @classmethod
    def from_checkpoint(cls, source: str) -> "GraniteFeatures":
        """The checkpoint's preprocessor_config.json values (a local directory, or a hub id
        already in the local cache), else the extractor's defaults."""
        from transformers.utils import cached_file

        path = Path(source) / "preprocessor_config.json"
        if not path.is_file():
            found = cached_file(source, "preprocessor_config.json", local_files_only=True,
                                _raise_exceptions_for_missing_entries=False,
                                _raise_exceptions_for_connection_errors=False)
            if found is None:
                return cls()
            path = Path(found)
        data = json.loads(path.read_text())
        return cls(**{k: int(data[k]) for k in ("sampling_rate", "n_fft", "win_length", "hop_length", "n_mels")
                      if k in data})

    def mel_filters(self) -> torch.Tensor:
        from transformers.audio_utils import mel_filter_bank

        fb = mel_filter_bank(num_frequency_bins=self.n_fft // 2 + 1, num_mel_filters=self.n_mels,
                             min_frequency=0.0, max_frequency=self.sampling_rate / 2,
                             sampling_rate=self.sampling_rate, norm=None, mel_scale="htk")
        return torch.from_numpy(fb).float()  # [freqs, mels]

    def frames(self, num_samples: int) -> int:
        """Encoder frames of a clip: two mel frames each."""
        return (num_samples // self.hop_length + 1) // 2

    def __call__(self, audios: list[np.ndarray], device: str = "cpu") -> dict:
        """GraniteSpeechFeatureExtractor's ``input_features`` (the adapter's contract)."""
        return {"input_features": self.log_mels(audios).to(device)}

    @torch.inference_mode()
    def log_mels(self, audios: list[np.ndarray]) -> torch.Tensor:
        """[B, frames, 2 * n_mels] features of the zero-padded batch."""
        longest = max(len(a) for a in audios)
        batch = torch.zeros(len(audios), longest)
        for i, a in enumerate(audios):
            batch[i, :len(a)] = torch.as_tensor(np.asarray(a, dtype=np.float32))
        spec = torch.stft(batch, self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                          window=torch.hann_window(self.win_length), center=True, pad_mode="reflect",
                          return_complex=True).abs().pow(2)                      # [B, freqs, T]
        logmel = torch.matmul(spec.transpose(-1, -2), self.mel_filters()).clamp(min=1e-10).log10()
        top = logmel.amax(dim=(-2, -1), keepdim=True)
        logmel = torch.maximum(logmel, top - 8.0) / 4 + 1
        if logmel.shape[1] % 2:
            logmel = logmel[:, :-1]
        return logmel.reshape(len(audios), -1, 2 * self.n_mels)
