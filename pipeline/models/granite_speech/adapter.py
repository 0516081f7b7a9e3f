"""granite-speech behind the model-adapter interface the SSD decoders use.

granite-speech is the model of the SSD paper: a CTC-trained conformer encoder, a Q-Former
projector that turns windows of 15 encoder frames into 3 audio embeddings, and a Granite
LLM that reads those embeddings in place of the ``<|audio|>`` tokens of a chat prompt.

- CTC draft (eqs. 2-3): the encoder's ``out`` linear (the same layer the encoder uses for
  its mid-layer conditioning) applied to the encoder's final hidden states; greedy CTC and
  frame entropies over the valid frames. The CTC vocabulary (id -> string, blank at
  ``ctc_blank``) is a constructor argument: granite's real head is character-level.
- Decoder states: the projector's audio embeddings, one row per utterance, with a
  trailing *validity channel* (1.0 for a real embedding, 0.0 for batch padding), so the
  number of audio embeddings of each row travels with the tensor through row selection
  and CPU offload; zero-padding a row keeps it valid (see ``pad_states``).
- Prompt: the tokenizer's chat template (an explicit granite-format string when the
  tokenizer has none) rendered with ONE audio token, which each row expands to its own
  number of audio embeddings (``batch_prompts``), exactly as GraniteSpeechProcessor does.
- ``decoder_hidden`` with no cache embeds the prompt+draft tokens and scatters the audio
  embeddings into the audio positions; with a cache it embeds only the new tokens.
- ``logits`` divides by ``text_config.logits_scaling`` (transformers v5's forward does not).
- Module paths: v5 ``model.model.{encoder,projector,language_model}`` + ``model.lm_head``;
  v4 ``model.{encoder,projector}`` + ``model.language_model.{model,lm_head}``.

Real checkpoints ship a LoRA adapter for the LLM that is only active with audio (and
audio is always present here): with peft installed transformers loads it into the LLM's
layers, which this adapter calls; merging it into the weights is faster (the paper does).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..base import ATTENTION_DECODER, CTC, CTCDraftBatch, EncoderBatch

HOP_SAMPLES = 160  # GraniteSpeechFeatureExtractor's mel hop; two mel frames per encoder frame
DEFAULT_INSTRUCTION = "can you transcribe the speech into a written format?"
# The granite chat format, used only when the tokenizer carries no chat template.
GRANITE_TURN = "<|start_of_role|>{role}<|end_of_role|>{content}<|end_of_text|>\n"
GRANITE_GENERATION = "<|start_of_role|>assistant<|end_of_role|>"


@dataclass
class GraniteEncoderBatch(EncoderBatch):
    """``states`` [B, N, H+1]: audio embeddings + validity channel; ``valid_frames`` [B]:
    audio embeddings per row. ``hidden`` [B, T, D] and ``frames`` [B]: the encoder's final
    hidden states and their valid frame counts (the CTC head's input)."""
    hidden: torch.Tensor | None = None
    frames: torch.Tensor | None = None


def audio_states(embeds: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B, N, H] embeddings + [B] valid counts -> [B, N, H+1] with the validity channel;
    padded embeddings are zeroed so that padding is all-zero, like ``pad_states``."""
    valid = torch.arange(embeds.shape[1], device=embeds.device)[None, :] < counts.to(embeds.device)[:, None]
    embeds = embeds.masked_fill(~valid.unsqueeze(-1), 0.0)
    return torch.cat([embeds, valid.unsqueeze(-1).to(embeds.dtype)], dim=-1)


def split_states(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N, H+1] -> (embeddings [B, N, H], valid [B, N] bool)."""
    return states[..., :-1], states[..., -1] > 0.5


def pad_states(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack per-row states [N_i, H+1] (e.g. trimmed for CPU offload) into [B, max N, H+1];
    the zero padding reads as invalid."""
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True, padding_value=0.0)


def _language_parts(model):
    """(encoder, projector, decoder-only LM body, lm_head) for transformers v5 or v4."""
    if hasattr(model, "lm_head") and hasattr(getattr(model, "model", None), "language_model"):
        inner = model.model                                     # transformers v5
        return inner.encoder, inner.projector, inner.language_model, model.lm_head
    if hasattr(model, "language_model") and hasattr(model, "encoder"):
        causal = model.language_model                           # transformers v4
        return model.encoder, model.projector, causal.model, causal.lm_head
    raise TypeError(f"{type(model).__name__} is not a GraniteSpeechForConditionalGeneration layout")


_UNBUILT = object()


class GraniteSpeechAdapter:
    # What Whisper's decoder offers and this one has not (pipeline.models.base.ARDecoderModel,
    # CTCModel): the chat prompt follows no decoding options, no language is configured,
    # greedy steps take the logits' argmax, the CTC frames are not timed (the family names
    # no vocabulary to spell words with) and the CTC head is the encoder's own ``out``.
    options = None
    prompt_language = None
    next_tokens = None
    frame_stride_s = None
    ctc_head = None

    def __init__(self, model, tokenizer, ctc_vocab: Sequence[str] | None, ctc_blank: int = 0,
                 device: str | torch.device = "cpu", instruction: str = DEFAULT_INSTRUCTION,
                 system_prompt: str | None = None, feature_extractor=None):
        self.model = model.requires_grad_(False).eval()
        self.encoder, self.projector, self.language_model, self.lm_head = _language_parts(model)
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        cfg = model.config
        text_cfg = cfg.text_config
        self.logits_scaling = float(getattr(text_cfg, "logits_scaling", 1.0) or 1.0)
        if ctc_vocab is not None and len(ctc_vocab) != self.encoder.out.out_features:
            raise ValueError(f"ctc_vocab has {len(ctc_vocab)} entries, the CTC head "
                             f"{self.encoder.out.out_features} outputs")
        self.ctc_vocab = list(ctc_vocab) if ctc_vocab is not None else None
        self.ctc_blank = ctc_blank
        self.window = int(cfg.window_size)
        self.queries_per_window = int(cfg.window_size) // int(cfg.downsample_rate)
        self.audio_token_id = int(cfg.audio_token_id)

        gen = getattr(model, "generation_config", None)
        eos = next((e for e in (getattr(gen, "eos_token_id", None), text_cfg.eos_token_id,
                                tokenizer.eos_token_id) if e is not None), None)
        if eos is None:
            raise ValueError("no end-of-text id in the generation config, text config or tokenizer")
        self.eot_id = int(eos[0] if isinstance(eos, (list, tuple)) else eos)

        self.prompt_head, self.prompt_tail = self._prompt_parts(instruction, system_prompt)
        self.vocab_size = int(text_cfg.vocab_size)
        # Never emitted: special tokens other than end-of-text (the audio placeholder, chat
        # roles: ``text`` drops them, so a transcript and a re-tokenised draft never hold
        # one) and the LM's vocabulary padding beyond the tokenizer (ids with no text).
        suppress = torch.zeros(self.vocab_size, dtype=torch.bool)
        added = getattr(tokenizer, "added_tokens_decoder", {})
        special = set(tokenizer.all_special_ids) | {self.audio_token_id}
        special |= {i for i, t in added.items() if getattr(t, "special", False)}
        suppress[sorted(i for i in special if i != self.eot_id and i < self.vocab_size)] = True
        suppress[min(len(tokenizer), self.vocab_size):] = True
        self.suppress_mask = suppress.to(self.device)
        self.begin_suppress_ids = torch.zeros(0, dtype=torch.long, device=self.device)
        self.max_positions = int(text_cfg.max_position_embeddings)
        self.capabilities = frozenset({ATTENTION_DECODER} | ({CTC} if self.ctc_vocab else set()))
        self._static_step = _UNBUILT

    def segment_cost(self, num_samples: int, packed: bool = False) -> int:
        """Encoder frames of a segment (two 10-ms mel frames each): its batch budget."""
        return (num_samples // HOP_SAMPLES + 1) // 2

    # --- prompt -------------------------------------------------------------------------
    def _prompt_parts(self, instruction: str, system_prompt: str | None) -> tuple[list[int], list[int]]:
        """Token ids before and after the single audio token of the rendered chat prompt."""
        audio = self.tokenizer.convert_ids_to_tokens(self.audio_token_id)
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
            [{"role": "user", "content": audio + instruction}]
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "".join(GRANITE_TURN.format(**m) for m in messages) + GRANITE_GENERATION
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if ids.count(self.audio_token_id) != 1:
            raise ValueError(f"the rendered prompt holds {ids.count(self.audio_token_id)} audio tokens, "
                             "not 1")
        at = ids.index(self.audio_token_id)
        return ids[:at], ids[at + 1:]

    def batch_prompts(self, encoder_states: torch.Tensor) -> list[list[int]]:
        """Per-row prompt ids: the chat prompt with one audio token per valid embedding."""
        counts = split_states(encoder_states)[1].sum(1).tolist()
        return [self.prompt_head + [self.audio_token_id] * n + self.prompt_tail for n in counts]

    # --- audio side -----------------------------------------------------------------------
    def audio_embeddings_count(self, frames: torch.Tensor) -> torch.Tensor:
        """Projector outputs per row: 3 (window // downsample) per started 15-frame window."""
        return (frames + self.window - 1) // self.window * self.queries_per_window

    @torch.inference_mode()
    def encode_features(self, features: torch.Tensor,
                        frames: torch.Tensor | None = None) -> GraniteEncoderBatch:
        """Encode precomputed input features [B, T, F] (GraniteSpeechFeatureExtractor's
        ``input_features``: stacked log-mels) whose first ``frames[b]`` frames are real."""
        from ...batching import equal_length_buckets

        features = features.to(self.device, self.dtype)
        B, T = features.shape[:2]
        frames = (torch.full((B,), T, dtype=torch.long) if frames is None else frames.long()).to(self.device)
        # The conformer takes no attention mask: its last attention block and its depthwise
        # convolutions would read a shorter clip's padding. Clips of one length are encoded
        # together, unpadded, so each gets the states it gets alone; the projector's windows
        # likewise see only the clip's own frames.
        parts = []
        for rows in equal_length_buckets(frames.tolist()):
            length = max(int(frames[rows[0]]), 1)     # a clip under one frame: no valid state, still a shape
            out = self.encoder(features[rows, :length])
            hidden = out if isinstance(out, torch.Tensor) else out.last_hidden_state
            parts.append((rows, hidden, self.projector(hidden)))
        hidden = parts[0][1].new_zeros(B, T, parts[0][1].shape[-1])
        embeds = parts[0][2].new_zeros(B, max(e.shape[1] for _, _, e in parts), parts[0][2].shape[-1])
        for rows, h, e in parts:
            index = torch.tensor(rows, device=hidden.device)
            hidden[index, :h.shape[1]] = h
            embeds[index, :e.shape[1]] = e
        counts = self.audio_embeddings_count(frames)
        return GraniteEncoderBatch(states=audio_states(embeds, counts), valid_frames=counts,
                                   hidden=hidden, frames=frames)

    def encode(self, audios: list[np.ndarray]) -> GraniteEncoderBatch:
        """Encode 16-kHz audio. Needs ``feature_extractor`` (GraniteSpeechFeatureExtractor,
        which needs torchaudio); without one, compute features and use ``encode_features``."""
        if self.feature_extractor is None:
            raise ValueError("granite-speech needs its feature extractor (torchaudio) to read audio; "
                             "pass feature_extractor= or call encode_features with precomputed features")
        from ...batching import equal_length_buckets

        shortest = _shortest_clip(self.feature_extractor)
        clips = [_zero_padded(np.asarray(a, dtype=np.float32), shortest) for a in audios]
        # The log-mels of a clip's last frames read the samples after it: its own reflection
        # alone, a longer neighbour's zero padding in a batch. Clips of one length share a call.
        parts = [(rows, self.feature_extractor([clips[i] for i in rows], device="cpu")["input_features"])
                 for rows in equal_length_buckets([len(c) for c in clips])]
        features = parts[0][1].new_zeros(len(clips), max(f.shape[1] for _, f in parts), parts[0][1].shape[-1])
        for rows, f in parts:
            features[rows, :f.shape[1]] = f
        frames = torch.tensor([(len(a) // HOP_SAMPLES + 1) // 2 for a in audios], dtype=torch.long)
        return self.encode_features(features, frames.clamp(max=features.shape[1]))

    @torch.inference_mode()
    def ctc_draft(self, enc: GraniteEncoderBatch) -> CTCDraftBatch:
        """Greedy CTC draft (eq. 2) and frame entropies over valid frames (eq. 3's inputs)."""
        from ..ctc_greedy import ctc_greedy

        if self.ctc_vocab is None:
            raise ValueError("no CTC vocabulary: configure model.ctc_vocab")
        T = int(enc.frames.max())
        log_probs = self.encoder.out(enc.hidden[:, :T]).float().log_softmax(-1)
        g = ctc_greedy(log_probs, enc.frames, blank=self.ctc_blank)
        texts = ["".join(self.ctc_vocab[t] for t in row) for row in g.tokens]
        return CTCDraftBatch(log_probs=log_probs, lengths=enc.frames, texts=texts,
                             entropy=g.entropy, max_entropy=g.max_entropy)

    # --- decoder side -----------------------------------------------------------------------
    def decoder_hidden(self, input_ids, encoder_states, cache=None, attention_mask=None,
                       position_ids=None):
        embed = self.language_model.get_input_embeddings()
        if cache is None:
            # Full prompt (+ draft): audio embeddings go where the audio tokens are, row by
            # row in order; each row's prompt holds exactly its valid embedding count.
            audio, valid = split_states(encoder_states)
            is_audio = input_ids == self.audio_token_id
            if not torch.equal(is_audio.sum(1), valid.sum(1)):
                raise ValueError("audio tokens in the prompt do not match the audio embeddings per row")
            embeds = embed(input_ids.masked_fill(is_audio, 0))
            embeds = embeds.masked_scatter(is_audio.unsqueeze(-1), audio[valid].to(embeds.dtype))
        else:
            embeds = embed(input_ids)
        out = self.language_model(inputs_embeds=embeds, attention_mask=attention_mask,
                                  position_ids=position_ids, cache=cache, use_cache=True)
        return out.last_hidden_state, out.cache

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return (self.lm_head(hidden) / self.logits_scaling).float()

    def static_step(self):
        """The Granite LLM's step over caller-owned K/V buffers (the static-cache greedy
        loop, pipeline.decoding.ar.static), built on first use; None for another LLM body,
        which greedy decoding runs in its eager loop."""
        if self._static_step is _UNBUILT:
            from .static_step import GraniteStaticStep

            body = self.language_model
            self._static_step = GraniteStaticStep(body) if type(body).__name__ == "GraniteModel" else None
        return self._static_step

    def text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True).strip()

    def tokenize(self, text: str) -> list[int]:
        # The assistant turn starts right after <|end_of_role|>: no leading space.
        return self.tokenizer.encode(text.strip(), add_special_tokens=False)


def _shortest_clip(extractor) -> int:
    """Samples the log-mel spectrogram needs (one FFT window: its centred frames reflect-pad
    by half a window, which a shorter clip alone cannot give)."""
    n_fft = getattr(extractor, "n_fft", None) or getattr(extractor, "melspec_kwargs", {}).get("n_fft", 512)
    return int(n_fft)


def _zero_padded(audio: np.ndarray, length: int) -> np.ndarray:
    """``audio`` with zeros after it up to ``length`` samples, the zeros a batch with a
    longer clip pads it with anyway; its valid frames still come from its own length."""
    return audio if len(audio) >= length else np.pad(audio, (0, length - len(audio)))


def load_granite_adapter(source: str, ctc_vocab: Sequence[str] | None, ctc_blank: int = 0, device: str = "cpu",
                         dtype: torch.dtype = torch.float32, **prompt) -> GraniteSpeechAdapter:
    """A granite-speech checkpoint (HF id or local directory, safetensors weights).
    ``ctc_vocab`` names the CTC head's outputs (the checkpoint does not; None: no CTC
    draft). Features come from transformers' extractor where torchaudio is installed, else
    from the same computation in plain torch (features.GraniteFeatures)."""
    from transformers import AutoConfig, GraniteSpeechForConditionalGeneration

    from ..attention import attention_implementation
    from ..errors import ModelError
    from ..registry import model_family

    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"model.source: cannot load a granite-speech config from {source} offline: "
                         f"{str(exc).splitlines()[0]}") from None
    # Given another model's config, from_pretrained would build a default-sized (billions of
    # parameters) random granite-speech model instead of failing.
    if not model_family("granite_speech").loads_model_type(getattr(config, "model_type", None)):
        raise ModelError(f"model.source: {source} is a {getattr(config, 'model_type', None)!r} model, "
                         "not granite_speech")
    try:
        model = GraniteSpeechForConditionalGeneration.from_pretrained(
            source, dtype=dtype, use_safetensors=True, local_files_only=True,
            attn_implementation=attention_implementation(GraniteSpeechForConditionalGeneration))
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"model.source: cannot load the granite-speech model at {source} offline: "
                         f"{str(exc).splitlines()[0]}") from None
    tokenizer, extractor = load_processing(source)
    return GraniteSpeechAdapter(model.to(device), tokenizer, ctc_vocab, ctc_blank=ctc_blank, device=device,
                                feature_extractor=extractor, **prompt)


def load_processing(source: str):
    """(tokenizer, feature extractor) of a granite-speech checkpoint; ModelError where the
    tokenizer cannot be loaded. The features fall back to the same computation in plain
    torch (features.GraniteFeatures) where torchaudio or the preprocessor config is missing.
    The driver's preflight calls this too (no weights are read)."""
    from transformers import AutoTokenizer

    from ..errors import load_component

    tokenizer = load_component(AutoTokenizer, source, "tokenizer")
    try:
        from transformers import GraniteSpeechFeatureExtractor

        extractor = GraniteSpeechFeatureExtractor.from_pretrained(source, local_files_only=True)
    except (ImportError, OSError):  # torchaudio missing, or no preprocessor config
        from .features import GraniteFeatures

        extractor = GraniteFeatures.from_checkpoint(source)
    return tokenizer, extractor
