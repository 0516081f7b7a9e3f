"""Character CTC head over a frozen Whisper encoder: the draft model of SSD
("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts").

The SSD paper drafts with the CTC output of a frozen acoustic encoder and gates on its
frame entropies (eq. 3). Whisper tiny.en has no CTC output, so we train one on its frozen
encoder states (d=384, 50 frames/s): a residual BiGRU adapter (each layer adds a
bidirectional GRU over the layer-normed states; per-direction width d/2) and a linear
projection onto 96 classes (blank + printable ASCII, ``pipeline.text.charset``).
The backward direction reads each row reversed within its own valid length (a gather, not
``pack_padded_sequence``, whose CPU path is 3-4x slower), so a row's output on its valid
frames does not depend on the padding or on the other rows of its batch.
The shipped weights live in ``pipeline/assets/ctc_head`` (fp16 safetensors, config.json,
MODEL_CARD.md).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

EMBEDDED = "embedded"
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "config.json"


def embedded_head_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "assets" / "ctc_head"


@dataclass
class CTCHeadConfig:
    d_model: int = 384
    num_classes: int = 96
    adapter_layers: int = 2
    dropout: float = 0.1
    # Frames stacked per GRU step: 2 halves the sequential GRU steps (the CPU cost); the
    # output layer then emits the logits of both frames, so CTC keeps 50 frames/s.
    frame_stack: int = 1
    charset: str = "blank+ascii32-126"
    encoder: str = "whisper-tiny.en (frozen, final layer)"


class CTCHead(nn.Module):
    def __init__(self, config: CTCHeadConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        if d % 2:
            raise ValueError("d_model must be even (two GRU directions of d/2)")
        k = config.frame_stack
        self.stack_in = nn.Linear(k * d, d) if k > 1 else None
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(config.adapter_layers))
        self.fwd = nn.ModuleList(nn.GRU(d, d // 2, batch_first=True)
                                 for _ in range(config.adapter_layers))
        self.bwd = nn.ModuleList(nn.GRU(d, d // 2, batch_first=True)
                                 for _ in range(config.adapter_layers))
        self.dropout = nn.Dropout(config.dropout)
        self.out_norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, k * config.num_classes)

    @staticmethod
    def reverse_index(lengths: torch.Tensor, t: int) -> torch.Tensor:
        """[B, T] index that reverses frames 0..len-1 of each row and leaves padding in place."""
        ar = torch.arange(t, device=lengths.device)[None, :]
        rev = lengths[:, None] - 1 - ar
        return torch.where(rev >= 0, rev, ar)

    def forward(self, states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """states [B, T, D], lengths [B] valid frames -> logits [B, T, C] (frames past a
        row's length hold values no caller may read)."""
        b, t_in, _ = states.shape
        x, _ = self.hidden(states, lengths)
        logits = self.out(self.out_norm(x))
        if self.config.frame_stack > 1:
            logits = logits.reshape(b, x.shape[1] * self.config.frame_stack, -1)[:, :t_in]
        return logits

    def hidden(self, states: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The adapter's output before the CTC layer: [B, ceil(T / frame_stack), D] at one
        step per ``frame_stack`` encoder frames, and each row's valid steps (the embedded
        transducer's encoder frames)."""
        b, t_in, d = states.shape
        lengths_in = lengths.to(states.device, torch.long).clamp(1, t_in)
        k = self.config.frame_stack
        if k > 1:
            # Zero every frame past a row's length, so a stacked group that straddles the
            # end reads zeros whatever the batch padding holds.
            t_pad = -(-t_in // k) * k
            valid = torch.arange(t_pad, device=states.device)[None, :] < lengths_in[:, None]
            x = nn.functional.pad(states, (0, 0, 0, t_pad - t_in)) * valid[..., None]
            x = self.stack_in(x.reshape(b, t_pad // k, k * d))
            lengths = -(-lengths_in // k)
        else:
            x, lengths = states, lengths_in
        t = x.shape[1]
        rev = self.reverse_index(lengths, t)[..., None]
        idx, idx_in = rev.expand(b, t, d // 2), rev.expand(b, t, d)
        for norm, fwd, bwd in zip(self.norms, self.fwd, self.bwd):
            h = norm(x)
            # Padding sits after the valid frames, so a left-to-right GRU never reads it
            # before a valid frame; the right-to-left pass runs on per-row reversed input.
            y_f, _ = fwd(h)
            y_b, _ = bwd(torch.gather(h, 1, idx_in))
            y = torch.cat([y_f, torch.gather(y_b, 1, idx)], dim=-1)
            x = x + self.dropout(y)
        return x, lengths

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def save_ctc_head(head: CTCHead, out_dir: str | Path, extra: dict | None = None) -> Path:
    """Write fp16 weights + config.json (fp16 halves the shipped size; inference is fp32)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float16).contiguous()
             for k, v in head.state_dict().items()}
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    cfg = asdict(head.config) | (extra or {})
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg, indent=1) + "\n")
    return out_dir


def load_ctc_head(source: str | Path = EMBEDDED, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32) -> CTCHead:
    """The head in eval mode: ``"embedded"`` (package data) or a directory of head files."""
    from safetensors.torch import load_file

    path = embedded_head_dir() if str(source) == EMBEDDED else Path(source)
    raw = json.loads((path / CONFIG_FILE).read_text())
    fields = CTCHeadConfig.__dataclass_fields__
    head = CTCHead(CTCHeadConfig(**{k: v for k, v in raw.items() if k in fields}))
    state = load_file(str(path / WEIGHTS_FILE))
    head.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return head.to(device=device, dtype=dtype).eval()


def warm_start(head: CTCHead, source: str | Path = EMBEDDED) -> tuple[int, int]:
    """Copy into ``head`` every tensor of the head at ``source`` (default: the shipped one)
    whose name and shape match, so a head for another encoder starts from what transfers
    (all of it for a tiny.en-wide encoder; for another width only the tensors that do not
    depend on it, such as the output bias, the blank's prior). Returns (tensors copied,
    tensors in ``head``)."""
    donor = load_ctc_head(source).state_dict()
    own = head.state_dict()
    same = {k: v.to(own[k].dtype) for k, v in donor.items() if k in own and own[k].shape == v.shape}
    head.load_state_dict(same, strict=False)
    return len(same), len(own)


def load_embedded_ctc_head(device: str | torch.device = "cpu") -> CTCHead:
    return load_ctc_head(EMBEDDED, device=device)
