"""The embedded transducer: a TDT predictor and joint ("Efficient Sequence Transduction by
Jointly Predicting Tokens and Durations", Xu et al. 2023, eqs. 1-4: the joint emits a token
distribution and a duration distribution per (frame, predictor state)) trained here on the
frozen Whisper tiny.en encoder, so that "Pushing the Limits of Beam Search Decoding for
Transducer-based ASR models" (ALSD++, pipeline.decoding.transducer) has a model with real
weights.

Encoder side, all frozen: Whisper tiny.en's encoder, then the shipped CTC head's residual
BiGRU adapter (``CTCHead.hidden``, one step per two encoder frames: 40-ms frames, 25 per
second), then a trained layer norm and projection to the joint width. Predictor: an
embedding over the character set (blank = 0 is also the start token, as Parakeet's
``generate`` starts from its blank), an LSTM and a projection. Joint:
``head(relu(frame + predictor))`` -> 96 token logits (blank + printable ASCII,
pipeline.text.charset) followed by the duration logits over ``durations``.

The adapter is the Parakeet adapter's interface (predictor state ``(h, c, out)``), so the
greedy and beam searches run unchanged. Weights: ``pipeline/assets/transducer``
(``transducer.safetensors``, fp16, run in fp32; ``config.json``; ``MODEL_CARD.md``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...audio import SAMPLE_RATE
from ..base import EncoderBatch
from .adapter import TransducerAdapter
from ..whisper.adapter import SAMPLES_PER_STATE, WhisperAdapter
from ...text import charset

EMBEDDED = "embedded"
# the RNN-T twin (no durations: what AES++ searches), trained like the TDT
EMBEDDED_RNNT = "embedded_rnnt"
# config.json's ``architectures`` entry, so ``--model DIR`` finds the transducer family
ARCHITECTURE = "ShardscribeWhisperTDT"
WEIGHTS_FILE = "transducer.safetensors"
CONFIG_FILE = "config.json"


def embedded_transducer_dir(source: str = EMBEDDED) -> Path:
    """The shipped transducer a ``model.source`` name stands for."""
    return Path(__file__).resolve().parents[2] / "assets" / ("transducer_rnnt" if source == EMBEDDED_RNNT
                                                               else "transducer")


def shipped_or_path(source: str | Path) -> Path:
    """``embedded`` / ``embedded_rnnt``: the shipped directory; anything else: the path."""
    return embedded_transducer_dir(str(source)) if str(source) in (EMBEDDED, EMBEDDED_RNNT) else Path(source)


def is_embedded_transducer_dir(path: str | Path) -> bool:
    return (Path(path) / WEIGHTS_FILE).is_file()


@dataclass
class EmbeddedTransducerConfig:
    d_encoder: int = 384            # the CTC head adapter's width
    d_model: int = 320              # predictor width
    d_joint: int = 160              # joint width (the joint runs on every lattice cell in training)
    vocab_size: int = 96            # blank + printable ASCII
    blank: int = 0
    durations: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    max_symbols_per_step: int = 10
    dropout: float = 0.1
    frame_stack: int = 2            # Whisper frames per transducer frame (the CTC head's)
    encoder: str = "whisper-tiny.en (frozen) + embedded CTC head adapter (frozen)"


class Predictor(nn.Module):
    def __init__(self, cfg: EmbeddedTransducerConfig):
        super().__init__()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.lstm = nn.LSTM(cfg.d_model, cfg.d_model, num_layers=1, batch_first=True)
        self.decoder_projector = nn.Linear(cfg.d_model, cfg.d_joint)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced outputs [B, U, H] of token sequences [B, U] from a zero state."""
        out, _ = self.lstm(self.dropout(self.embedding(tokens)))
        return self.decoder_projector(self.dropout(out))


class Joint(nn.Module):
    def __init__(self, cfg: EmbeddedTransducerConfig):
        super().__init__()
        self.head = nn.Linear(cfg.d_joint, cfg.vocab_size + len(cfg.durations))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, decoder_hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.relu(encoder_hidden_states + decoder_hidden_states)))


class EmbeddedTransducer(nn.Module):
    """Everything trained: the frame projection, the predictor and the joint."""

    def __init__(self, cfg: EmbeddedTransducerConfig):
        super().__init__()
        self.config = cfg
        self.encoder_norm = nn.LayerNorm(cfg.d_encoder)
        self.encoder_projector = nn.Linear(cfg.d_encoder, cfg.d_joint)
        self.decoder = Predictor(cfg)
        self.joint = Joint(cfg)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """CTC-adapter outputs [..., d_encoder] -> joint-width frames [..., d_joint]."""
        return self.encoder_projector(self.encoder_norm(hidden))

    def all_logits(self, frames: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Training view: joint logits [B, T, U + 1, V + D] of projected ``frames`` [B, T, H]
        and label sequences ``targets`` [B, U] (the predictor reads blank, y1 .. yU)."""
        start = torch.full_like(targets[:, :1], self.config.blank)
        pred = self.decoder(torch.cat([start, targets], 1))
        return self.joint(pred[:, None], frames[:, :, None])

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def save_embedded_transducer(model: EmbeddedTransducer, out_dir: str | Path, extra: dict | None = None) -> Path:
    """fp16 safetensors + config.json (fp16 halves the shipped size; inference is fp32)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {"architectures": [ARCHITECTURE]} | asdict(model.config) | (extra or {})
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
    return out_dir


def load_embedded_transducer(source: str | Path = EMBEDDED, device="cpu",
                             dtype: torch.dtype = torch.float32) -> EmbeddedTransducer:
    from safetensors.torch import load_file

    path = shipped_or_path(source)
    if not is_embedded_transducer_dir(path):
        raise ValueError(f"model.source: no embedded-format transducer at {path} (no {WEIGHTS_FILE})")
    raw = json.loads((path / CONFIG_FILE).read_text())
    fields = EmbeddedTransducerConfig.__dataclass_fields__
    model = EmbeddedTransducer(EmbeddedTransducerConfig(**{k: v for k, v in raw.items() if k in fields}))
    model.load_state_dict({k: v.to(torch.float32) for k, v in load_file(str(path / WEIGHTS_FILE)).items()})
    return model.to(device=device, dtype=dtype).eval()


class _CharTokenizer:
    """What the word-timestamp and report code ask of a tokenizer, over the character set:
    a space is spelt as SentencePiece's bare word marker."""

    def decode(self, ids, **_) -> str:
        return charset.decode([int(i) for i in ids])

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return ["\u2581" if c == " " else c for c in (charset.decode([int(i)]) for i in ids)]


class EmbeddedTransducerAdapter(TransducerAdapter):
    """The transducer interface over Whisper (``whisper``: a WhisperAdapter with the
    embedded CTC head; None where only the predictor and joint are needed)."""

    def __init__(self, model: EmbeddedTransducer, whisper=None, ctc_head=None, device="cpu"):
        cfg = model.config
        self.model = model.requires_grad_(False).eval()
        self.whisper = whisper
        self.ctc_head = ctc_head if ctc_head is not None else (whisper.ctc_head if whisper is not None else None)
        self.tokenizer = _CharTokenizer()
        self.feature_extractor = None
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.blank = int(cfg.blank)
        self.start_token = self.blank
        self.vocab_size = int(cfg.vocab_size)
        self.durations = [int(d) for d in cfg.durations] if cfg.durations else None
        self.max_symbols = int(cfg.max_symbols_per_step)
        self.frame_stack = int(cfg.frame_stack)
        self.frame_shift_s = self.frame_stack * SAMPLES_PER_STATE / SAMPLE_RATE

    def vocabulary(self):
        from ...text.ctc_vocabulary import CharsetVocabulary

        return CharsetVocabulary()

    def segment_cost(self, num_samples: int, packed: bool = False) -> int:
        return -(-WhisperAdapter.valid_frames(num_samples) // self.frame_stack)

    @torch.inference_mode()
    def frames_of_states(self, states: torch.Tensor, valid: torch.Tensor) -> EncoderBatch:
        """Whisper encoder states [B, T, 384] with valid frames -> projected transducer frames."""
        head_dtype = next(self.ctc_head.parameters()).dtype
        hidden, lengths = self.ctc_head.hidden(states[:, :int(valid.max())].to(head_dtype), valid)
        return EncoderBatch(states=self.model.project(hidden.to(self.dtype)), valid_frames=lengths)

    @torch.inference_mode()
    def encode(self, audios: list[np.ndarray]) -> EncoderBatch:
        if self.whisper is None:
            raise ValueError("this transducer adapter has no encoder (dropped for the beam pool)")
        enc = self.whisper.encode_isolated(audios)
        return self.frames_of_states(enc.states, enc.valid_frames)

    def decode_text(self, ids) -> str:
        return charset.decode([int(i) for i in ids if int(i) != self.blank])

    def drop_encoder(self) -> None:
        self.whisper = None
        self.ctc_head = None


def load_embedded_transducer_adapter(source: str = EMBEDDED, device: str = "cpu", dtype=torch.float32,
                                     cache_dir=None) -> EmbeddedTransducerAdapter:
    """Whisper tiny.en with the embedded CTC head (the frozen encoder side) and the
    transducer at ``source`` (``embedded``: the shipped TDT; ``embedded_rnnt``: its RNN-T twin;
    or a train-transducer output)."""
    from ..whisper.adapter import load_whisper_adapter

    model = load_embedded_transducer(source, device=device, dtype=dtype)
    whisper = load_whisper_adapter(EMBEDDED, device=device, dtype=dtype, cache_dir=cache_dir, ctc_head=EMBEDDED)
    return EmbeddedTransducerAdapter(model, whisper, device=device)
