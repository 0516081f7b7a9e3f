"""The job config's own sections: the model's common keys, the decoder, audio, batching,
Ray, output, storage, confidence and pseudo-labelling. A decoder kind's options live in its
package (``pipeline.kinds.<kind>``), a model family's in its folder
(``pipeline.models.<family>``); ``pipeline.config`` collects them all into one JobConfig.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .batching import UnsetMaxTokens
from .config_values import ConfigError, at_least, check_token_map, choice, flat_keys


def default_family() -> str:
    """model.family where a config names none: the model registry says which."""
    from .models import DEFAULT_FAMILY

    return DEFAULT_FAMILY


def default_kind() -> str:
    """decoder.kind where a config names none: the decoder registry says which."""
    from .kinds import DEFAULT_KIND

    return DEFAULT_KIND


@dataclass
class ModelConfig:
    """The keys every model family has; a family's own keys (``model.ctc_head``,
    ``model.quantize``, ...) are its options dataclass (``ModelFamily.options``), read
    through this object as ``cfg.model.<key>``."""
    family: str = field(default_factory=default_family)   # a registered model family (pipeline.models)
    # "embedded" (the family's shipped model), a local dir, an HF id, or a checkpoint
    # folder's fsspec URL (s3://, gs://, file://, ...: fetched once per node into cache_dir)
    source: str = "embedded"
    # auto | cpu | cuda | cuda:N. auto: CUDA where the process that loads the model has a
    # GPU (a Ray model actor: the one Ray assigned it), else the CPU.
    device: str = "auto"
    # auto | float32 | float16 | bfloat16, resolved where the model loads. auto: bfloat16 on
    # a CUDA device with native bfloat16 (compute capability 8.0+) for a checkpoint that runs
    # in it (the shipped Whisper models do not: their decoder flips words), float32
    # elsewhere (the CPU, older GPUs). Any CUDA model runs float32 products in TF32.
    # config_hash reads auto as float32 (the old default): folders it wrote still resume.
    dtype: str = "auto"
    # converted checkpoints, and models fetched from a URL (under models/); default
    # $SHARDSCRIBE_CACHE, else ~/.cache/shardscribe. Not in config_hash.
    cache_dir: str | None = None
    # A Hugging Face id not in the local cache is downloaded before any worker starts
    # (--allow-download); false: refused in one line saying how to fetch it. Not in config_hash.
    allow_download: bool = False
    # torch intra-op threads per model worker; 0: OMP_NUM_THREADS (Ray sets it to an actor's
    # CPUs), else the physical cores the process may use (pipeline.device.worker_threads)
    num_threads: int = 0
    # torch.compile the encoder (pipeline.models.compile): one static-shape graph per batch
    # shape the buckets produce; the first batch of each shape pays the compile. Same texts
    # within float tolerance; not in config_hash.
    compile: bool = False
    options: object = field(default=None, repr=False)   # the family's options (a dataclass) or None

    def __post_init__(self):
        if self.options is None:
            from .models import FAMILIES

            family = FAMILIES.get(self.family)
            cls = family.options_class(self.source) if family is not None else None
            self.options = cls() if cls is not None else None

    def __getattr__(self, name: str):
        # Called only where normal lookup fails: the family's own keys, then a key another
        # registered family has, which reads as that family's default here.
        if name.startswith("__"):
            raise AttributeError(name)
        options = self.__dict__.get("options")
        if options is not None and hasattr(options, name):
            return getattr(options, name)
        from .models.registry import option_default

        found, value = option_default(name)
        if found:
            return value
        raise AttributeError(f"model.{name}: no such key for model.family={self.__dict__.get('family')}")

    def with_values(self, **changes) -> "ModelConfig":
        """A copy with ``changes`` applied to the common keys and the family's options."""
        import dataclasses

        core = {k: v for k, v in changes.items() if k in {f.name for f in dataclasses.fields(self)}}
        rest = {k: v for k, v in changes.items() if k not in core}
        options = dataclasses.replace(self.options, **rest) if rest else self.options
        return dataclasses.replace(self, **core, options=options)

    def validate(self, key: str) -> None:
        choice(f"{key}.dtype", self.dtype, ("auto", "float32", "float16", "bfloat16"))
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"{key}.device: expected auto, cpu, cuda or cuda:N, got {self.device!r}")
        at_least(f"{key}.num_threads", self.num_threads, 0)
        if self.options is not None and hasattr(self.options, "validate"):
            self.options.validate(key, self)


@dataclass
class DecoderConfig:
    EXECUTION_KEYS = ("use_cuda_graphs",)   # not in config_hash: the same tokens either way
    # config_hash: left out while at their defaults (rows written before the keys existed still match)
    HASHED_WHEN_SET = ("temperature_fallback", "fallback_temperatures", "fallback_compression_ratio",
                       "fallback_logprob", "fallback_seed")
    kind: str = field(default_factory=default_kind)   # a registered decoder kind (pipeline.kinds)
    max_new_tokens: int = 224
    # Several short clips per encoder pass, isolated from each other (pipeline.packing:
    # block-diagonal attention, so a clip's text does not depend on its neighbours); only
    # for decoder kinds that read the encoder states alone, on models that can pack
    # windows. Faster, but a clip sees only its own frames, not a padded 30-s window:
    # off in the shipped configs for their accuracy (docs/ctc_greedy.md has both).
    pack_windows: bool = False
    # A token map (`shardscribe build-token-map`) to draft with in greedy AR decoding, the
    # ar kind's and SSD's fallback (section token_map); null: off.
    token_map: str | None = None
    # Greedy AR decoding (ar, SSD's fallback) over a static KV cache with its step replayed
    # as a CUDA graph on CUDA devices (pipeline.decoding.ar.graphs); the CPU keeps
    # the eager loop, which is faster there (docs/ar.md). Same tokens either way.
    use_cuda_graphs: bool = True
    # Whisper's temperature fallback, in the ar kind only (pipeline.kinds.ar.fallback;
    # docs/languages.md): a segment whose greedy text has a compression ratio above
    # fallback_compression_ratio or a mean token log-probability below fallback_logprob is
    # decoded again by seeded sampling at each of fallback_temperatures in turn.
    # translate: with model.task=translate only (base's translations loop without it);
    # always: every task (transcripts of such segments change); off.
    temperature_fallback: str = "translate"
    fallback_temperatures: list = field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0])  # tried in turn
    fallback_compression_ratio: float | None = 2.4   # a text above it fails (Whisper's); null: not checked
    fallback_logprob: float | None = -1.0            # a mean token log-prob below it fails (Whisper's); null: not checked
    fallback_seed: int = 0                           # the samples' seed: the same text on every run

    def validate(self, key: str) -> None:
        at_least(f"{key}.max_new_tokens", self.max_new_tokens, 1)
        if self.token_map is not None:
            check_token_map(f"{key}.token_map", self.token_map)
        choice(f"{key}.temperature_fallback", self.temperature_fallback, ("translate", "always", "off"))
        temps = self.fallback_temperatures
        if not isinstance(temps, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                                  and 0 < t <= 2 for t in temps):
            raise ConfigError(f"{key}.fallback_temperatures: expected a list of temperatures in (0, 2], got {temps!r}")
        if self.fallback_compression_ratio is not None and self.fallback_compression_ratio <= 0:
            raise ConfigError(f"{key}.fallback_compression_ratio: must be > 0 or null, "
                              f"got {self.fallback_compression_ratio}")
        if self.fallback_logprob is not None and self.fallback_logprob >= 0:
            raise ConfigError(f"{key}.fallback_logprob: must be < 0 or null, got {self.fallback_logprob}")


@dataclass
class ConfidenceConfig:
    # Word, segment and row confidence (pipeline.confidence): the features cost one
    # teacher-forced decoder pass per segment for attention decoders (ar, ssd).
    enabled: bool = False
    # "embedded": the calibration shipped for the embedded model (pipeline/assets/confidence;
    # another model gets uncalibrated confidences); a `shardscribe calibrate` output; null:
    # uncalibrated.
    calibration: str | None = "embedded"

    def validate(self, key: str) -> None:
        if self.calibration not in (None, "embedded") and not Path(self.calibration).is_file():
            raise ConfigError(f"{key}.calibration: no calibration file at {self.calibration} "
                              "(write one with `shardscribe calibrate`)")


@dataclass
class AudioConfig:
    HASHED_WHEN_SET = ("max_seconds", "stream", "window_s", "window_overlap_s")   # config_hash: left out while at its default
    max_segment_s: float = 30.0       # longer recordings are segmented (at most the family's window)
    vad_threshold: float = 0.5        # silero-vad speech probability
    vad_pad_s: float = 0.2            # context kept around speech when cutting
    resample_quality: str = "HQ"      # soxr quality
    # A read (or decode) of one recording that takes longer becomes that row's error: a
    # FIFO, a hung network mount or a stalled object-store read must not stall the job.
    read_timeout_s: float = 300.0
    # The most audio decoded for one recording (or one manifest span): a longer one is an
    # error row (too_long), whatever its header claims, so one file's time is bounded (its
    # memory is not a matter of its length: a long recording is streamed, window_s).
    max_seconds: float = 14400.0
    # Which audio stream of a file with several (a video with two languages, a recording with
    # a track per microphone) is transcribed: 0 is the first. A file without that stream is an
    # error row (unsupported).
    stream: int = 0
    # A recording longer than window_s + window_overlap_s is decoded and segmented as a
    # stream (pipeline.prepare_stream): the VAD runs over windows of window_s seconds, each
    # seen with window_overlap_s more after it, so a cut is made only at a pause the VAD saw
    # whole; what one recording holds is then a window, not the recording. Shorter ones are
    # segmented whole, as one window.
    window_s: float = 60.0
    # Seconds the VAD sees past a window's end: a span must end this far before it to be cut.
    window_overlap_s: float = 5.0
    # A streamed recording's segments go on to the model in pieces of this many seconds of
    # the recording: its progress moves with them, and no more than one piece of its audio
    # waits for the model.
    piece_s: float = 300.0

    def validate(self, key: str) -> None:
        if self.read_timeout_s <= 0:
            raise ConfigError(f"{key}.read_timeout_s: must be > 0, got {self.read_timeout_s}")
        if not (math.isfinite(self.max_seconds) and self.max_seconds >= 1.0):
            raise ConfigError(f"{key}.max_seconds: must be a finite number >= 1, got {self.max_seconds}")
        if isinstance(self.stream, bool) or not isinstance(self.stream, int) or self.stream < 0:
            raise ConfigError(f"{key}.stream: must be an audio stream's index, an integer >= 0, got {self.stream!r}")
        if self.max_segment_s < 1.0:
            raise ConfigError(f"{key}.max_segment_s: must be >= 1, got {self.max_segment_s}")
        if not 0.0 < self.vad_threshold < 1.0:
            raise ConfigError(f"{key}.vad_threshold: must be in (0, 1), got {self.vad_threshold}")
        at_least(f"{key}.vad_pad_s", self.vad_pad_s, 0.0)
        if not (math.isfinite(self.window_s) and self.window_s > self.max_segment_s):
            raise ConfigError(f"{key}.window_s: must be longer than audio.max_segment_s ({self.max_segment_s:g} s), "
                              f"got {self.window_s}")
        if not (math.isfinite(self.window_overlap_s) and self.window_overlap_s >= 2 * self.vad_pad_s):
            raise ConfigError(f"{key}.window_overlap_s: must be at least twice audio.vad_pad_s "
                              f"({2 * self.vad_pad_s:g} s), got {self.window_overlap_s}")
        if not (math.isfinite(self.piece_s) and self.piece_s > 0):
            raise ConfigError(f"{key}.piece_s: must be a number > 0, got {self.piece_s}")
        choice(f"{key}.resample_quality", self.resample_quality, ("VHQ", "HQ", "MQ", "LQ", "QQ"))


@dataclass
class BatchingConfig:
    # Rows (recordings) read and prepared at a time. The model stage joins consecutive
    # blocks until their segments fill max_tokens (up to max_joined_blocks of them) and
    # cuts the segments into GPU sub-batches of at most max_tokens: it sets how soon rows
    # show and, with max_joined_blocks, the audio a call holds, not the GPU batch. With
    # short clips on a large GPU whose budget max_joined_blocks blocks do not fill, raise it.
    recordings_per_batch: int = 16
    # The GPU batch: padded encoder frames per model sub-batch (segments x the widest
    # segment's frames; Whisper: 1500 a segment). null: 24000 on the CPU; on CUDA, sized
    # where the model loads from the GPU's free memory and the model's size
    # (pipeline.batching.resolve_max_tokens), at least one segment. A number is used as
    # set on every device.
    max_tokens: int | None = UnsetMaxTokens()
    # Rows in a job's first batch; the next ones double up to recordings_per_batch
    # (pipeline.batching.slow_start), so the first rows finish, and show in the progress,
    # within seconds, for a few extra batches a job. recordings_per_batch or more: no ramp.
    first_batch: int = 1
    # Input blocks one model-stage call may join until their segments fill max_tokens
    # (pipeline.regroup): the more segments a call sorts by length, the fuller and less
    # padded its sub-batches. 1: a call per block, as read.
    max_joined_blocks: int = 4

    def __post_init__(self):
        if self.max_tokens is None:
            self.max_tokens = UnsetMaxTokens()

    def validate(self, key: str) -> None:
        at_least(f"{key}.recordings_per_batch", self.recordings_per_batch, 1)
        at_least(f"{key}.first_batch", self.first_batch, 1)
        at_least(f"{key}.max_joined_blocks", self.max_joined_blocks, 1)
        at_least(f"{key}.max_tokens", self.max_tokens, 1)


# Logical CPUs a local instance keeps free of the actor pools: the driver's own work and
# Ray's tasks (the model preflight's device check) need one, and without one free a task
# waits for ever.
RAY_TASK_CPUS = 1


# Logical CPUs a local instance may declare per CPU of the machine: Ray's CPUs are logical
# (the plan asks for twice the cores), but far beyond the machine nothing can run.
LOCAL_CPUS_PER_CORE = 64
AUTO = "auto"


@dataclass
class RayCPUs:
    """What a plan asks of Ray: a local instance's logical CPUs (None: a cluster's own), a
    model actor's CPUs, which Ray also makes its threads (OMP_NUM_THREADS), and the CPUs of
    all the actor pools together."""
    local: int | None
    decode_actor: float
    pools: float


@dataclass
class RayConfig:
    address: str | None = None        # None: start a local instance
    num_cpus: int | None = None       # logical CPUs for a local instance (default: 2 x cores, or what the pools need)
    # Model actors. "auto": one per GPU of the cluster, more as GPUs join it (up to
    # max_decode_actors); on a cluster without GPUs one per node, on a local instance one.
    # A number: exactly that many, checked against the cluster before any starts.
    decode_actors: int | str = AUTO
    max_decode_actors: int | None = None   # the most "auto" grows to (null: no cap)
    # CPUs of a model actor, hence its threads. null: on a local instance, the physical
    # cores divided among the model actors (within ray.num_cpus when that is set); on a
    # cluster, 1.
    decode_actor_cpus: float | None = None
    # Decode/segment actors per model actor, on its node. "auto": one on a local
    # instance; on a cluster, what the node's CPUs left per model actor allow (1 to 4).
    audio_actors: int | str = AUTO
    audio_actor_cpus: float = 0.5
    # Rows the driver hands a model actor per call (a work unit), at most; a unit's rows
    # are read, prepared, decoded and pooled for the second stage by that actor alone. A
    # job with fewer rows than 4 units per actor is cut finer. A Parquet source's row
    # group is never split.
    rows_per_unit: int = 512
    # The cluster adds nodes on demand (an autoscaler): asks beyond its resources at the
    # start wait for nodes instead of failing.
    autoscaling: bool = False
    # The job fails in one line when no model actor has started within this long.
    start_timeout_s: float = 600.0
    # The job fails with a clear message when no model actor reports progress for this
    # long while work is outstanding; -1 switches the watchdog off.
    no_progress_timeout_s: float = 1800.0

    def validate(self, key: str) -> None:
        if self.no_progress_timeout_s <= 0 and self.no_progress_timeout_s != -1:
            raise ConfigError(f"{key}.no_progress_timeout_s: must be > 0 or -1 (off), got {self.no_progress_timeout_s}")
        for name in ("decode_actors", "audio_actors"):
            value = getattr(self, name)
            if isinstance(value, str):
                if value != AUTO:
                    raise ConfigError(f"{key}.{name}: expected auto or a number, got {value!r}")
            else:
                at_least(f"{key}.{name}", value, 1)
        if self.max_decode_actors is not None:
            at_least(f"{key}.max_decode_actors", self.max_decode_actors, 1)
        at_least(f"{key}.rows_per_unit", self.rows_per_unit, 1)
        if self.start_timeout_s <= 0:
            raise ConfigError(f"{key}.start_timeout_s: must be > 0, got {self.start_timeout_s}")
        if (self.decode_actor_cpus is not None and self.decode_actor_cpus <= 0) or self.audio_actor_cpus <= 0:
            raise ConfigError(f"{key}: actor CPU shares must be > 0")
        if self.num_cpus is not None:
            at_least(f"{key}.num_cpus", self.num_cpus, 1)
        if self.address is None:
            self._check_local_instance(key)

    @property
    def local_decode_actors(self) -> int:
        """Model actors on a local instance: the number set, or one ("auto")."""
        return 1 if self.decode_actors == AUTO else int(self.decode_actors)

    @property
    def local_audio_actors(self) -> int:
        return 1 if self.audio_actors == AUTO else int(self.audio_actors)

    def _check_local_instance(self, key: str) -> None:
        """A local instance's numbers against the machine: Ray takes any logical CPU count
        and starts any number of actors, and fails (or waits) only after its start-up."""
        cores = os.cpu_count() or 1
        cap = LOCAL_CPUS_PER_CORE * cores
        asks = [("num_cpus", self.num_cpus or 0), ("decode_actor_cpus", self.decode_actor_cpus or 0),
                ("audio_actor_cpus", self.audio_actor_cpus), ("decode_actors", self.local_decode_actors),
                ("audio_actors", self.local_audio_actors)]
        for name, value in asks:
            if value > cap:
                raise ConfigError(f"{key}.{name}: a local Ray instance on this machine ({cores} CPUs) takes at most "
                                  f"{cap}, got {value:g} (set ray.address to run on a cluster)")

    def cpus(self, cores: int | None = None, instance_cpus: float | None = None) -> RayCPUs:
        """The plan's CPU asks on a local instance or a cluster; ``cores``: the machine's
        physical cores (default: this process's); ``instance_cpus``: the logical CPUs of a
        local instance already running, which the pools must then fit instead of
        ``num_cpus``. Each model actor comes with its audio actors."""
        actors = self.local_decode_actors
        others = actors * self.local_audio_actors * self.audio_actor_cpus
        decode = self.decode_actor_cpus
        if decode is None and self.address is not None:
            decode = 1.0
        elif decode is None:
            if cores is None:
                from .device import physical_cores

                cores = physical_cores()
            decode = cores // actors
            cap = instance_cpus if instance_cpus is not None else self.num_cpus
            if cap is not None:
                decode = min(decode, int((cap - others - RAY_TASK_CPUS) // actors))
            decode = float(max(1, decode))
        pools = others + actors * decode
        if self.address is not None:
            return RayCPUs(None, decode, pools)
        need = math.ceil(pools + RAY_TASK_CPUS)
        return RayCPUs(self.num_cpus or max(4, 2 * (os.cpu_count() or 1), need), decode, pools)


@dataclass
class OutputConfig:
    # Rows per Parquet part: one part is one commit (written under a temporary name, then
    # renamed), so a crash redoes at most this many rows per writer; tens of thousands
    # keep a million-row job at tens of files.
    rows_per_part: int = 20000
    # Both runners also commit their finished rows once this long has passed since the
    # last commit (pipeline.output.PartCommitter), so a killed job (SIGKILL, a lost
    # machine) loses about this much work (or one batch, if a batch takes longer), not
    # rows_per_part rows (hours at CPU speed). null: by count only.
    commit_interval_s: float | None = 300.0

    def validate(self, key: str) -> None:
        at_least(f"{key}.rows_per_part", self.rows_per_part, 1)
        if self.commit_interval_s is not None:
            at_least(f"{key}.commit_interval_s", self.commit_interval_s, 0.0)


@dataclass
class FiltersConfig:
    """Pseudo-label filters run in the pass (pipeline.filters; docs/pseudo_label.md has
    what each catches). A threshold set to null switches its check off."""
    HASHED_WHEN_SET = ("english_only_logprob",)   # config_hash: left out while at its default
    max_compression_ratio: float | None = 2.4   # Whisper's failed-decode threshold per 30-s window
    min_unique_word_share: float | None = 0.3   # distinct words / words in a segment
    unique_words_min_count: int = 12            # the share is judged from this many words on
    max_ngram_repeats: int | None = 4           # the same n-gram more times in a row than this
    ngram_max_n: int = 8                        # longest repeated phrase looked for, in words
    max_word_chars: int | None = 24             # Granary flags a word of 25 characters or more
    min_chars_per_second: float | None = 1.5    # letters and digits per second of segment
    max_chars_per_second: float | None = 30.0
    phrases: list = field(default_factory=list)  # hallucination phrases (e.g. "thank you for watching")
    phrase_match: str = "whole"                 # whole: the text is a phrase (Granary) | contains: it holds one
    language: str | None = None                 # expected language; rows whose detected language differs
    # English-only Whisper models (tiny.en): a segment whose greedy text has a mean token
    # log-probability below this, or a compression ratio above max_compression_ratio
    # (Whisper's failed-decode rule), is written with language und and the reason
    # language_mismatch (pipeline.models.whisper.language_check; one teacher-forced decoder
    # pass per segment; docs/languages.md has the measurement). null: off.
    english_only_logprob: float | None = -1.0

    def validate(self, key: str) -> None:
        for name in ("max_compression_ratio", "max_chars_per_second", "min_chars_per_second"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{key}.{name}: must be > 0 or null, got {value}")
        if self.min_unique_word_share is not None and not 0.0 < self.min_unique_word_share <= 1.0:
            raise ConfigError(f"{key}.min_unique_word_share: must be in (0, 1] or null, "
                              f"got {self.min_unique_word_share}")
        if (self.min_chars_per_second is not None and self.max_chars_per_second is not None
                and self.min_chars_per_second >= self.max_chars_per_second):
            raise ConfigError(f"{key}.min_chars_per_second: must be below max_chars_per_second")
        at_least(f"{key}.unique_words_min_count", self.unique_words_min_count, 1)
        at_least(f"{key}.ngram_max_n", self.ngram_max_n, 1)
        for name in ("max_ngram_repeats", "max_word_chars"):
            if getattr(self, name) is not None:
                at_least(f"{key}.{name}", getattr(self, name), 1)
        if not isinstance(self.phrases, list) or not all(isinstance(p, str) and p.strip() for p in self.phrases):
            raise ConfigError(f"{key}.phrases: expected a list of non-empty strings")
        choice(f"{key}.phrase_match", self.phrase_match, ("whole", "contains"))
        if self.english_only_logprob is not None and self.english_only_logprob >= 0:
            raise ConfigError(f"{key}.english_only_logprob: must be < 0 or null, got {self.english_only_logprob}")


PSEUDO_LABEL_RANKINGS = ("excess_errors", "confidence")
PSEUDO_LABEL_FILTER_UNITS = ("row", "segment")


@dataclass
class PseudoLabelConfig:
    """The exports of `shardscribe pseudo-label` (they do not change the rows)."""
    max_utterance_s: float = 30.0     # training utterances are at most this long (cut at word times)
    reliability_bins: int = 10        # confidence bins of the reliability diagram
    # --keep-fraction's order: excess expected word errors or the row's P(no error)
    # (pipeline.pseudo_label; docs/pseudo_label.md has the measurement behind the default)
    rank_by: str = "excess_errors"
    # What a segment's filter reason leaves out: its whole row, or (long-form recordings)
    # that segment alone, the row's other segments still exported.
    filter_unit: str = "row"

    def validate(self, key: str) -> None:
        if self.max_utterance_s <= 0:
            raise ConfigError(f"{key}.max_utterance_s: must be > 0, got {self.max_utterance_s}")
        at_least(f"{key}.reliability_bins", self.reliability_bins, 2)
        choice(f"{key}.rank_by", self.rank_by, PSEUDO_LABEL_RANKINGS)
        choice(f"{key}.filter_unit", self.filter_unit, PSEUDO_LABEL_FILTER_UNITS)


@dataclass
class StorageConfig:
    # fsspec storage options, applied to the input, the audio it names and the output alike
    # (s3: endpoint_url, client_kwargs.region_name, anon, ...). Credentials come from each
    # filesystem's standard chain (environment, profile files, instance metadata), never
    # from here: a config file is copied into logs and job specs.
    options: dict = field(default_factory=dict)

    SECRET_KEYS = ("key", "secret", "token", "password", "aws_access_key_id", "aws_secret_access_key",
                   "aws_session_token", "access_key", "secret_key", "session_token", "account_key",
                   "sas_token", "client_secret", "connection_string", "credentials", "authorization")

    def validate(self, key: str) -> None:
        if not isinstance(self.options, dict):
            raise ConfigError(f"{key}.options: expected a mapping of fsspec storage options")
        secret = sorted(k for k in flat_keys(self.options) if k.rsplit(".", 1)[-1].lower() in self.SECRET_KEYS)
        if secret:
            raise ConfigError(f"{key}.options.{secret[0]}: credentials are read from the standard chain "
                              "(environment, profile, instance metadata), not from the config")


@dataclass
class SecondStageConfig:
    """How a two-stage decoder kind's second stage (SSD's AR fallback, beam search) is fed:
    its pending segments pooled across input batches into full token-budget batches
    (pipeline.pending_pool), or decoded batch by batch. How a job runs, not what it writes."""
    # Pool pending segments across batches (false: each batch's own pending segments
    # together, 1-15 of 32 rows for SSD: latency-bound on a GPU)
    pooled: bool = True
    # A pooled segment is decoded at the latest this long after it arrived, full batch or
    # not (a slow source cannot hold finished first-stage work back)
    max_wait_s: float = 30.0
    # Pending segments held at most (pooled and being decoded): beyond it the first stage
    # waits (the Ray driver stops taking blocks; the local runner decodes what it holds)
    max_pending_segments: int = 512

    def validate(self, key: str) -> None:
        if not isinstance(self.pooled, bool):
            raise ConfigError(f"{key}.pooled: expected true or false, got {self.pooled!r}")
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s >= 0):
            raise ConfigError(f"{key}.max_wait_s: must be a finite number >= 0, got {self.max_wait_s}")
        at_least(f"{key}.max_pending_segments", self.max_pending_segments, 1)
