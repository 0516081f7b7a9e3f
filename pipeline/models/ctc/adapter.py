"""Any transformers CTC checkpoint (``AutoModelForCTC``) behind the model-adapter interface.

The ``ctc`` family serves "FlexCTC: GPU-powered CTC Beam Decoding": its searches run over
the per-frame distributions of a real CTC model (Wav2Vec2ForCTC, HubertForCTC,
ParakeetForCTC, ...). Everything model-specific comes from the checkpoint itself:

- features: the model's own feature extractor, run on each clip alone, then padded with
  the extractor's own ``pad`` (its padding value, plus an attention mask) so that a padded
  batch gives every clip exactly the inputs it has alone. Where padding leaks into the
  valid frames whatever the mask says, the model runs in equal-length buckets instead
  (clips of one input length stacked, no padding): see :func:`padding_leaks`;
- encoder states: the CTC logits of the model's own forward. The CTC head is part of that
  forward (a linear for wav2vec2, a 1x1 conv for Parakeet) and no decoder here needs the
  hidden states, so keeping the logits makes the log-probs equal the model's by
  construction, with no per-architecture head lookup;
- valid frames: the model's own output-length rule applied to each clip's input length
  (``_get_feat_extract_output_lengths`` for the wav2vec2-style models,
  ``_get_subsampling_output_length`` for Parakeet, the rule its ``generate`` masks with);
- the shortest input: a clip shorter than the model's minimum (wav2vec2's conv stack needs
  400 samples for one frame) is zero-padded up to it, alone or in a batch of such clips,
  and keeps its own valid frame count (none): it gets empty text in any batch instead
  of an error when alone;
- blank: the model config's ``pad_token_id`` (the id its CTC loss uses as blank);
- text: the processor's (or tokenizer's) ``batch_decode`` of each row's frame-wise argmax
  over its valid frames, i.e. the model's own CTC decoding rules (grouping, blank removal,
  word delimiter).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ...batching import equal_length_buckets
from ..base import BEAM_VOCABULARY, CTC, CTCDraftBatch, EncoderBatch
from ...text.ctc_vocabulary import ctc_blank_id

SAMPLE_RATE = 16000


class CTCModelAdapter:
    capabilities = frozenset({CTC, BEAM_VOCABULARY})   # vocabulary: pipeline.models.ctc.ctc_vocabulary
    ctc_head = None     # the CTC head is part of the model's own forward (no head to swap)

    def __init__(self, model, feature_extractor, tokenizer, processor=None, device: str | torch.device = "cpu"):
        self.model = model.requires_grad_(False).eval()
        self.feature_extractor = feature_extractor
        self.tokenizer = tokenizer
        self.processor = processor
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        if getattr(feature_extractor, "sampling_rate", SAMPLE_RATE) != SAMPLE_RATE:
            raise ValueError(f"the feature extractor reads {feature_extractor.sampling_rate} Hz audio; "
                             f"the pipeline delivers {SAMPLE_RATE} Hz")
        self.blank = ctc_blank_id(model.config, tokenizer)
        self.vocab_size = int(model.config.vocab_size)
        self.input_name = list(feature_extractor.model_input_names)[0]   # input_values or input_features
        self.batched = not padding_leaks(model, feature_extractor)
        self.pad_multiple: int | None = None        # set by use_static_shapes
        self._input_length = lru_cache(maxsize=4096)(self._input_length_uncached)
        self.min_input_length = self._shortest_input()

    # --- lengths ------------------------------------------------------------------------------
    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        """Model frames for inputs of ``input_lengths`` (samples or feature frames), by the
        model's own rule; a model without one keeps its input's frame count."""
        lengths = input_lengths.long()
        if hasattr(self.model, "_get_feat_extract_output_lengths"):      # wav2vec2, hubert, ...
            return self.model._get_feat_extract_output_lengths(lengths).long()
        if hasattr(self.model, "_get_subsampling_output_length"):        # parakeet
            return self.model._get_subsampling_output_length(lengths).long()
        return lengths

    def _shortest_input(self, longest: int = 1 << 16) -> int:
        """The shortest input (samples or feature frames) the length rule gives a frame."""
        lengths = torch.arange(1, longest)
        first = (self.output_lengths(lengths) >= 1).nonzero()
        return int(lengths[first[0, 0]]) if len(first) else 1

    def _input_length_uncached(self, num_samples: int) -> int:
        if self.input_name == "input_values":       # the raw waveform is the input
            return num_samples
        feats = self._features(np.zeros(num_samples, dtype=np.float32))
        return self._lengths([feats])[0]

    @property
    def frame_stride_s(self) -> float:
        """Seconds per output frame, from the model's own length rule over 30 s (to the
        millisecond: wav2vec2's 20 ms, Parakeet's 80 ms, whatever edge frames they add)."""
        n = 30 * SAMPLE_RATE
        return round(n / self.segment_cost(n) / SAMPLE_RATE, 3)

    def segment_cost(self, num_samples: int, packed: bool = False) -> int:
        """The model's output frames for a segment of ``num_samples``: its batch budget."""
        return int(self.output_lengths(torch.tensor([self._input_length(num_samples)]))[0])

    # --- audio side ---------------------------------------------------------------------------
    def _features(self, audio: np.ndarray):
        return self.feature_extractor(np.asarray(audio, dtype=np.float32), sampling_rate=SAMPLE_RATE,
                                      return_tensors="pt")

    def _lengths(self, feats) -> list[int]:
        """Each clip's input length: its attention mask's sum, else its input's time axis."""
        return [int(f["attention_mask"].sum()) if "attention_mask" in f else int(f[self.input_name].shape[1])
                for f in feats]

    def _pad(self, feats):
        """Per-clip features -> one padded batch through the extractor's own ``pad``."""
        rows = [{k: v[0] for k, v in f.items() if k in (self.input_name, "attention_mask")} for f in feats]
        return self.feature_extractor.pad(rows, padding="longest", return_attention_mask=True,
                                          pad_to_multiple_of=self.pad_multiple, return_tensors="pt")

    def use_static_shapes(self) -> None:
        """Pad batches up to whole seconds of input, so that a compiled model
        (pipeline.models.compile) sees few distinct shapes; the mask hides the extra
        padding. A model run in equal-length buckets gets no padding to add."""
        self.pad_multiple = self._input_length(SAMPLE_RATE)

    def _at_least_shortest(self, inputs: dict) -> dict:
        """``inputs`` zero-padded on the time axis (a masked-out tail where there is a mask)
        to the model's shortest input: the model runs, and the clip's own length still
        sets its valid frames."""
        short = self.min_input_length - inputs[self.input_name].shape[1]
        if short <= 0:
            return inputs
        return {k: torch.cat([v, v.new_zeros((v.shape[0], short, *v.shape[2:]))], 1) for k, v in inputs.items()}

    @torch.inference_mode()
    def _logits(self, inputs) -> torch.Tensor:
        inputs = {k: v.to(self.device) for k, v in self._at_least_shortest(inputs).items()}
        inputs[self.input_name] = inputs[self.input_name].to(self.dtype)
        return self.model(**inputs).logits.float()

    def encode(self, audios: list[np.ndarray]) -> EncoderBatch:
        """16-kHz audio -> CTC logits [B, T, V] and each row's valid frames."""
        feats = [self._features(a) for a in audios]
        inputs_len = torch.tensor(self._lengths(feats), dtype=torch.long)
        if self.batched:
            logits = self._logits(self._pad(feats))
        else:
            logits = self._bucketed_logits(feats)
        frames = self.output_lengths(inputs_len).clamp(max=logits.shape[1]).to(logits.device)
        return EncoderBatch(states=logits, valid_frames=frames)

    def _bucketed_logits(self, feats) -> torch.Tensor:
        """Logits of a model that padding leaks into: clips of one input length run as one
        unpadded batch (a clip alone sees exactly those inputs), rows back in input order."""
        rows: list[torch.Tensor | None] = [None] * len(feats)
        for members in equal_length_buckets([int(f[self.input_name].shape[1]) for f in feats]):
            out = self._logits({self.input_name: torch.cat([feats[i][self.input_name] for i in members])})
            for i, row in zip(members, out):
                rows[i] = row
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)

    @torch.inference_mode()
    def ctc_draft(self, enc: EncoderBatch) -> CTCDraftBatch:
        """Greedy CTC over the valid frames; the text through the model's own decoding."""
        from ..ctc_greedy import ctc_greedy

        T = int(enc.valid_frames.max()) if len(enc.valid_frames) else 0
        log_probs = enc.states[:, :T].float().log_softmax(-1)
        g = ctc_greedy(log_probs, enc.valid_frames, blank=self.blank)
        best = log_probs.argmax(-1).tolist()
        ids = [row[:n] for row, n in zip(best, enc.valid_frames.tolist())]
        texts = (self.processor or self.tokenizer).batch_decode(ids)
        return CTCDraftBatch(log_probs=log_probs, lengths=enc.valid_frames, texts=texts,
                             entropy=g.entropy, max_entropy=g.max_entropy)


def padding_leaks(model, feature_extractor) -> bool:
    """Whether a padded batch can change a clip's outputs however the padding is masked:
    the extractor returns no attention mask, the model's forward takes none, or the conv
    feature encoder group-normalises (``feat_extract_norm="group"``: wav2vec2's default,
    also HuBERT's, WavLM's, SEW's), which takes each channel's mean and variance over the
    whole time axis, padding included, before any mask applies (transformers'
    Wav2Vec2FeatureExtractor docs: such models were not trained with an attention mask)."""
    import inspect

    names = list(feature_extractor.model_input_names)
    returns_mask = "attention_mask" in names and bool(getattr(feature_extractor, "return_attention_mask", True))
    takes_mask = "attention_mask" in inspect.signature(model.forward).parameters
    return not (returns_mask and takes_mask) or getattr(model.config, "feat_extract_norm", None) == "group"


def _looks_local(source: str) -> bool:
    return source.startswith((".", "/", "~")) or Path(source).expanduser().exists() or source.count("/") > 1


def load_ctc_adapter(source: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> CTCModelAdapter:
    """An ``AutoModelForCTC`` checkpoint from a local directory or a Hugging Face id already
    in the local cache (nothing is downloaded), with its processor, or its feature
    extractor and tokenizer where it ships no processor."""
    from transformers import AutoConfig, AutoModelForCTC
    from transformers.models.auto.modeling_auto import MODEL_FOR_CTC_MAPPING

    from ..attention import attention_implementation
    from ..errors import ModelError

    if _looks_local(source) and not Path(source).expanduser().is_dir():
        raise ModelError(f"model.source: no CTC model at {source} (not a directory)")
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
        model_class = MODEL_FOR_CTC_MAPPING.get(type(config), None)
        attention = attention_implementation(model_class) if model_class is not None else None
        model = AutoModelForCTC.from_pretrained(source, config=config, dtype=dtype, local_files_only=True,
                                                attn_implementation=attention)
    # transformers raises ValueError for a model type without a CTC class, OSError for
    # missing files: both are the checkpoint's problem, named with its path
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"model.source: cannot load a CTC model from {source} offline: "
                         f"{str(exc).splitlines()[0]}") from None
    extractor, tokenizer, processor = load_processing(source)
    return CTCModelAdapter(model.to(device), extractor, tokenizer, processor=processor, device=device)


def load_processing(source: str):
    """(feature extractor, tokenizer, processor or None) of a CTC checkpoint: its processor
    where it has one, else its feature extractor and tokenizer; ModelError naming the part
    that cannot be loaded. The driver's preflight calls this too (no weights are read)."""
    from transformers import AutoFeatureExtractor, AutoProcessor, AutoTokenizer

    from ..errors import load_component

    try:
        processor = AutoProcessor.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, TypeError):
        processor = None
    if processor is not None and hasattr(processor, "feature_extractor") and hasattr(processor, "tokenizer"):
        return processor.feature_extractor, processor.tokenizer, processor
    # AutoProcessor gave a lone tokenizer or extractor, or nothing
    return (load_component(AutoFeatureExtractor, source, "feature extractor"),
            load_component(AutoTokenizer, source, "tokenizer"), None)
