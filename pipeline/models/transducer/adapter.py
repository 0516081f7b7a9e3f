"""transformers' ``ParakeetForRNNT`` / ``ParakeetForTDT`` behind the transducer interface
the searches of "Pushing the Limits of Beam Search Decoding for Transducer-based ASR
models" (pipeline.decoding.transducer) call.

Everything comes from the checkpoint itself:

- features: the model's own feature extractor on each clip alone, padded by the
  extractor's ``pad`` (padding value plus attention mask), so a padded batch gives every
  clip the inputs it has alone;
- encoder frames: ``get_audio_features``' ``pooler_output``, the encoder output already
  projected to the joint's width (``encoder_projector``); valid frames from the encoder's
  own output mask, the lengths its ``generate`` stops at;
- predictor: the LSTM prediction network (``decoder``: embedding, LSTM, projector). Its
  state is ``(h, c, out)``; like ``generate`` it starts by reading the decoder start token
  (the blank) from a zero state and advances only on emitted tokens;
- joint: ``head(act(frame + predictor out))``; its first ``vocab_size`` outputs are the
  token logits (blank included), the rest, for TDT, the duration logits over
  ``config.durations``.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ..base import TRANSDUCER, EncoderBatch

SAMPLE_RATE = 16000


class TransducerAdapter:
    capabilities = frozenset({TRANSDUCER})

    def __init__(self, model, feature_extractor, tokenizer, device: str | torch.device = "cpu"):
        self.model = model.requires_grad_(False).eval()
        self.feature_extractor = feature_extractor
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        cfg = model.config
        if getattr(feature_extractor, "sampling_rate", SAMPLE_RATE) != SAMPLE_RATE:
            raise ValueError(f"the feature extractor reads {feature_extractor.sampling_rate} Hz audio; "
                             f"the pipeline delivers {SAMPLE_RATE} Hz")
        self.blank = int(cfg.blank_token_id)
        self.vocab_size = int(cfg.vocab_size)
        durations = getattr(cfg, "durations", None)
        self.durations = None if durations is None else [int(d) for d in durations]
        self.max_symbols = int(cfg.max_symbols_per_step)
        start = getattr(model.generation_config, "decoder_start_token_id", None)
        self.start_token = self.blank if start is None else int(start)
        self.input_name = list(feature_extractor.model_input_names)[0]
        self._input_length = lru_cache(maxsize=4096)(self._input_length_uncached)
        subsampling = int(getattr(cfg.encoder_config, "subsampling_factor", 8))
        hop = int(getattr(feature_extractor, "hop_length", 160))
        self.frame_shift_s = subsampling * hop / SAMPLE_RATE

    # --- lengths ------------------------------------------------------------------------------
    def _input_length_uncached(self, num_samples: int) -> int:
        feats = self._features(np.zeros(num_samples, dtype=np.float32))
        return int(feats["attention_mask"].sum()) if "attention_mask" in feats else int(feats[self.input_name].shape[1])

    def segment_cost(self, num_samples: int, packed: bool = False) -> int:
        """Encoder frames of a segment of ``num_samples``: its batch budget."""
        n = torch.tensor([self._input_length(num_samples)])
        return int(self.model.encoder._get_subsampling_output_length(n)[0])

    # --- audio side ---------------------------------------------------------------------------
    def _features(self, audio: np.ndarray):
        return self.feature_extractor(np.asarray(audio, dtype=np.float32), sampling_rate=SAMPLE_RATE,
                                      return_tensors="pt")

    @torch.inference_mode()
    def encode(self, audios: list[np.ndarray]) -> EncoderBatch:
        """16-kHz audio -> projected encoder frames [B, T, H] and each row's valid frames."""
        feats = [self._features(a) for a in audios]
        rows = [{k: v[0] for k, v in f.items() if k in (self.input_name, "attention_mask")} for f in feats]
        inputs = self.feature_extractor.pad(rows, padding="longest", return_attention_mask=True,
                                            return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        inputs[self.input_name] = inputs[self.input_name].to(self.dtype)
        out = self.model.get_audio_features(input_features=inputs[self.input_name],
                                            attention_mask=inputs.get("attention_mask"), output_attention_mask=True)
        states = out.pooler_output
        if out.attention_mask is not None:
            frames = out.attention_mask.sum(-1).long()
        else:
            frames = torch.full((states.shape[0],), states.shape[1], dtype=torch.long, device=states.device)
        return EncoderBatch(states=states, valid_frames=frames)

    # --- predictor and joint (pipeline.models.base.TransducerModel) ----------------------
    def predictor_init(self, n: int):
        """The state after the decoder start token, read from a zero state (as ``generate``)."""
        dec = self.model.decoder
        layers, hidden = dec.lstm.num_layers, dec.lstm.hidden_size
        zeros = torch.zeros(layers, n, hidden, device=self.device, dtype=self.dtype)
        start = torch.full((n,), self.start_token, dtype=torch.long, device=self.device)
        return self.predictor_step(start, (zeros, zeros.clone(), None))

    @torch.inference_mode()
    def predictor_step(self, tokens: torch.Tensor, state):
        """Read ``tokens`` [N] from ``state``: the next state ``(h, c, out)``."""
        dec = self.model.decoder
        h, c, _ = state
        emb = dec.embedding(tokens)[:, None]
        out, (h, c) = dec.lstm(emb, (h, c))
        return h, c, dec.decoder_projector(out[:, 0])

    @staticmethod
    def predictor_output(state) -> torch.Tensor:
        return state[2]

    @staticmethod
    def select_state(state, index: torch.Tensor):
        h, c, out = state
        return h.index_select(1, index), c.index_select(1, index), out.index_select(0, index)

    @staticmethod
    def where_state(mask: torch.Tensor, new, old):
        h1, c1, o1 = new
        h0, c0, o0 = old
        m = mask[None, :, None]
        return torch.where(m, h1, h0), torch.where(m, c1, c0), torch.where(mask[:, None], o1, o0)

    @staticmethod
    def put_state(state, index: torch.Tensor, rows):
        """``state`` with rows ``index`` replaced by ``rows`` (a state of len(index) rows)."""
        (h, c, out), (h1, c1, o1) = state, rows
        return h.index_copy(1, index, h1), c.index_copy(1, index, c1), out.index_copy(0, index, o1)

    @torch.inference_mode()
    def joint_logits(self, frames: torch.Tensor, pred_out: torch.Tensor) -> torch.Tensor:
        """Raw joint outputs [..., V (+ D)] of encoder frames and predictor outputs."""
        return self.model.joint(decoder_hidden_states=pred_out, encoder_hidden_states=frames)

    def joint(self, frames: torch.Tensor, pred_out: torch.Tensor):
        """Token log-probs [..., V] and, for TDT, duration log-probs [..., D] (else None)."""
        logits = self.joint_logits(frames, pred_out).float()
        tokens = logits[..., :self.vocab_size].log_softmax(-1)
        if self.durations is None:
            return tokens, None
        return tokens, logits[..., self.vocab_size:].log_softmax(-1)

    # --- text -----------------------------------------------------------------------------------
    def vocabulary(self):
        """The non-blank tokens as phrase boosting spells text with them."""
        from ...text.ctc_vocabulary import TokenizerVocabulary

        return TokenizerVocabulary(self.tokenizer, self.blank, self.vocab_size)

    def decode_text(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) != self.blank], skip_special_tokens=True,
                                     **({"group_tokens": False} if _groups(self.tokenizer) else {}))

    def drop_encoder(self) -> None:
        """Free the encoder where only the predictor and joint are needed (the beam pool)."""
        self.model.encoder = None


def _groups(tokenizer) -> bool:
    """Parakeet's tokenizer collapses repeats (its CTC rule) unless told not to."""
    return type(tokenizer).__name__.startswith("Parakeet")


def _looks_local(source: str) -> bool:
    return source.startswith((".", "/", "~")) or Path(source).expanduser().exists() or source.count("/") > 1


def load_transducer_adapter(source: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> TransducerAdapter:
    """A ParakeetForRNNT / ParakeetForTDT checkpoint from a local directory or a Hugging Face
    id already in the local cache (nothing is downloaded), with its feature extractor and
    tokenizer."""
    from transformers import AutoConfig, ParakeetForRNNT, ParakeetForTDT

    from ..attention import attention_implementation
    from ..registry import model_family
    from ..errors import ModelError

    if _looks_local(source) and not Path(source).expanduser().is_dir():
        raise ModelError(f"model.source: no transducer model at {source} (not a directory)")
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"model.source: cannot load a transducer config from {source} offline: "
                         f"{str(exc).splitlines()[0]}") from None
    family = model_family("transducer")
    if not family.loads_model_type(getattr(config, "model_type", None)):
        raise ModelError(f"model.source: {source} is a {config.model_type!r} model, not a transducer "
                         f"({', '.join(sorted(family.known_model_types()))})")
    cls = {"parakeet_rnnt": ParakeetForRNNT, "parakeet_tdt": ParakeetForTDT}[config.model_type]
    try:
        model = cls.from_pretrained(source, dtype=dtype, local_files_only=True,
                                    attn_implementation=attention_implementation(cls))
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"model.source: cannot load the transducer at {source} offline: "
                         f"{str(exc).splitlines()[0]}") from None
    extractor, tokenizer = load_processing(source)
    return TransducerAdapter(model.to(device), extractor, tokenizer, device=device)


def load_processing(source: str):
    """(feature extractor, tokenizer) of a Parakeet transducer checkpoint; ModelError naming
    the part that cannot be loaded. The driver's preflight calls this too (no weights)."""
    from transformers import AutoFeatureExtractor, AutoTokenizer

    from ..errors import load_component

    return (load_component(AutoFeatureExtractor, source, "feature extractor"),
            load_component(AutoTokenizer, source, "tokenizer"))
