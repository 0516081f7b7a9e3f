#!/usr/bin/env bash
# Everything a lent GPU machine checks, in one call, under 10 minutes; JSON results in $OUT.
#
#   1. installs the wheels carried in $WHEELS, and Ray where its wheel was carried in two
#      halves (.ray1/raypart.aa, .ray2/raypart.ab: ../shared/gpu/README.md, "Ray: two calls
#      on a warm machine"; a step records whether Ray imports);
#   2. the CUDA tests (the files that skip without CUDA);
#   3. `shardscribe bench regimes` with the pooled second-stage rows (SSD against full AR,
#      both presets, the rejected rows of 8 and 32 batches in one fallback call);
#   4. the end-to-end job, `--runner local --set model.device=cuda`, on a random-weight
#      checkpoint of whisper-large-v3-turbo's shape (d_model 1280, 32 encoder layers, 4
#      decoder layers, 128 mel bins, vocab 51866; tiny.en's tokenizer, carried in
#      $PROCESSOR) saved here with transformers, with a random CTC head of its width, over
#      $CLIPS copies of the bundled samples: ssd pooled and ssd second_stage.pooled=false
#      (blocks of 4), each job's summary.json (its second_stage counts) copied to $OUT, all
#      gathered in $OUT/results.json;
#   4b. `shardscribe bench e2e` at both shapes (turbo's above; parakeet-tdt-0.6b's: random
#      weights, a 1024-piece tokenizer): the job's RTFx (in-process, and through Ray where
#      it imports) against its own model alone on the same clips, and where the rest goes;
#      $OUT/e2e_turbo.json, $OUT/e2e_parakeet_tdt.json;
#   5. the same `ar` job through Ray on the one GPU (`--runner ray`: a local instance, one
#      model actor on the GPU, its audio actor beside it), and its RTFx as a share of the
#      in-process runner's (results.json's ray_over_local); skipped where Ray is missing.
#
# Build the carried files on a machine with the project (not needed for GPU_CHECK_QUICK=1):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d wheels \
#     transformers==5.24.0 jiwer rapidfuzz soundfile soxr cffi pycparser silero-vad
#   .venv/bin/python -c "from shardscribe.jobs.bench.regimes import whisper_parts; whisper_parts('wheels/processor')"
# (wheels/ is git-ignored: name it in the device tool's carry.)
#
# GPU_CHECK_QUICK=1: toy sizes and a few clips on the CPU, the same steps (how this script is
# checked where there is no GPU). Each step has its own time limit and its exit status in
# $OUT/steps.jsonl; a failing step does not stop the next.
set -uo pipefail

OUT=${OUT:-/tmp/gpu_check_out}
WHEELS=${WHEELS:-wheels}
QUICK=${GPU_CHECK_QUICK:-0}
PY=${PYTHON:-python3}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check_work}
# tiny.en's tokenizer, feature extractor and configs (written from the embedded model where
# the directory does not exist yet: here, never on the GPU machine, which lacks that model)
if [ "$QUICK" = 1 ]; then PROCESSOR=${PROCESSOR:-$WORK/processor}; else PROCESSOR=${PROCESSOR:-$WHEELS/processor}; fi
export PROCESSOR   # the CUDA tests build their toy Whisper with its tokenizer
mkdir -p "$OUT" "$WORK"
: > "$OUT/steps.jsonl"

if [ "$QUICK" = 1 ]; then
    CLIPS=${CLIPS:-16}; DEVICE=cpu; BENCH_ARGS=(--quick --device cpu --batch 6)
    LIMIT_TESTS=120; LIMIT_BENCH=240; LIMIT_JOB=300; LIMIT_E2E=400; LIMIT_CHECKPOINT=300
else
    # Worst case, every step at its limit: 30 + 90 + 150 + 90 + 2 x 120 + 4 x 50 + 30 = 830 s:
    # over the device's 10 minutes a call, so a call that runs the e2e steps skips the
    # regimes bench (GPU_CHECK_SKIP_BENCH=1) or the tests.
    CLIPS=${CLIPS:-256}; DEVICE=cuda; BENCH_ARGS=(--pool 8,32 --rounds 2)
    LIMIT_TESTS=90; LIMIT_BENCH=150; LIMIT_JOB=50; LIMIT_E2E=120; LIMIT_CHECKPOINT=90
fi

if [ -f .ray1/raypart.aa ] && [ -f .ray2/raypart.ab ] && ! "$PY" -c "import ray" 2>/dev/null; then
    # Ray's wheel is over one call's carry: its halves came in two calls (wheel name kept).
    RAY_WHL=$(cat .ray1/name 2>/dev/null || echo ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl)
    mkdir -p "$WORK/raywheel" && cat .ray1/raypart.aa .ray2/raypart.ab > "$WORK/raywheel/$RAY_WHL"
fi
# The checkout as the `shardscribe` package without installing it (the device machine has no
# index to build from): the repository's root is the package's folder, so a link named
# shardscribe to it, on the path, is the package.
SRC="$WORK/src"
mkdir -p "$SRC" && ln -sfn "$PWD" "$SRC/shardscribe"
if ls "$WHEELS"/*.whl "$WORK"/raywheel/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/site $(ls "$WHEELS"/*.whl "$WORK"/raywheel/*.whl \
        2>/dev/null) > "$OUT/pip.log" 2>&1
    export PYTHONPATH=/tmp/site:$SRC
else
    export PYTHONPATH=$SRC
fi
export PYTHONUNBUFFERED=1

step() {   # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, record status
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    printf '{"step": "%s", "rc": %d, "seconds": %d}\n' "$name" "$rc" "$(( $(date +%s) - start ))" \
        >> "$OUT/steps.jsonl"
    echo "$name: rc=$rc ($(( $(date +%s) - start )) s)"
    return 0
}

step env 30 "$PY" -c "
import json, platform, torch, transformers
print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__,
                  'transformers': transformers.__version__, 'cuda': torch.cuda.is_available(),
                  'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}))" 
cp "$OUT/env.log" "$OUT/env.json" 2>/dev/null

# 2. CUDA tests: the files whose tests skip without CUDA (graph replay = eager for the CTC
#    beam, greedy AR and SSD's seeded fallback, the transducer loops; NGPU-LM GPU = CPU).
step cuda_tests "$LIMIT_TESTS" "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_beam_graphs.py tests/test_lm_ngpu.py tests/test_ar_static.py tests/test_transducer_static.py \
    -k "cuda or graph"

# 3. The regimes bench with the pooled rows (GPU_CHECK_SKIP_BENCH=1: not this time).
[ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ] || step bench_regimes "$LIMIT_BENCH" "$PY" -m shardscribe.jobs.cli bench regimes "${BENCH_ARGS[@]}" \
    --whisper-processor "$PROCESSOR" --out "$OUT/regimes.json"

# 4. End to end on a turbo-shaped random checkpoint.
cat > "$WORK/make_checkpoint.py" <<'EOF'
"""A random-weight Whisper of large-v3-turbo's shape (toy dims with quick), tiny.en's
tokenizer and generation config, a 128-bin feature extractor, a random CTC head of its
width; and a manifest of N copies of the bundled samples."""
import json
import sys
from pathlib import Path

import torch
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

from shardscribe.jobs.bench.regimes import TOY_WHISPER, TURBO, whisper_parts
from shardscribe.pipeline.models.whisper.ctc_head import CTCHead, CTCHeadConfig, save_ctc_head

work, quick, processor_dir, clips = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
processor, generation, base = whisper_parts(processor_dir)
dims = {**(TOY_WHISPER if quick else TURBO), "num_mel_bins": 128, "vocab_size": 51866}
config = base.__class__(**{**base.to_dict(), **dims})
torch.manual_seed(0)
model = WhisperForConditionalGeneration(config)
model.generation_config = generation
model.save_pretrained(work / "turbo")
processor.feature_extractor = WhisperFeatureExtractor(feature_size=128)
processor.save_pretrained(work / "turbo")
save_ctc_head(CTCHead(CTCHeadConfig(d_model=config.d_model, num_classes=96, frame_stack=2)), work / "head")
samples = Path("pipeline/assets/samples")
lines = [json.loads(x) for x in (samples / "samples.jsonl").read_text().splitlines()]
with open(work / "clips.jsonl", "w") as fh:
    for i in range(clips):
        x = lines[i % len(lines)]
        fh.write(json.dumps({"id": f"{x['id']}-{i:04d}", "audio": str((samples / x["audio"]).resolve()),
                             "text": x.get("text")}) + "\n")
# parakeet-tdt-0.6b's shape (toy encoder with quick): random weights, a unigram tokenizer of
# 1024 pieces trained on the bundled references (blank: the last id), as bench ctc-beam
# builds its parakeet-ctc-0.6b.
from shardscribe.jobs.bench.ctc_beam_model import unigram_tokenizer   # noqa: E402
from shardscribe.jobs.bench.regimes import TOY_PARAKEET   # noqa: E402
from transformers import ParakeetFeatureExtractor, ParakeetForTDT, ParakeetProcessor, ParakeetTDTConfig   # noqa: E402
tokenizer = unigram_tokenizer([x.get("text") or "" for x in lines] * 50, pieces=1024)
tdt = ParakeetTDTConfig(**({"encoder_config": TOY_PARAKEET} if quick else {}), vocab_size=1025, blank_token_id=1024)
torch.manual_seed(0)
ParakeetForTDT(tdt).eval().save_pretrained(work / "parakeet_tdt")
ParakeetProcessor(ParakeetFeatureExtractor(feature_size=tdt.encoder_config.num_mel_bins), tokenizer) \
    .save_pretrained(work / "parakeet_tdt")
print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "clips": clips}))
EOF
step checkpoint "$LIMIT_CHECKPOINT" "$PY" "$WORK/make_checkpoint.py" "$WORK" "$QUICK" "$PROCESSOR" "$CLIPS"

# 4b. bench e2e at both shapes: the job (in-process, and through Ray where it imports)
#     against its own model on the same clips, and where the rest goes.
E2E_RUNNERS=local
"$PY" -c "import ray" 2>/dev/null && E2E_RUNNERS=local,ray
E2E_DTYPE=float32
[ "$DEVICE" = cuda ] && E2E_DTYPE=bfloat16
E2E_ARGS=(--manifest "$WORK/clips.jsonl" --device "$DEVICE" --runners "$E2E_RUNNERS" --rounds 2)
[ "$QUICK" = 1 ] && E2E_ARGS+=(--quick --limit 8)
step bench_e2e_turbo "$LIMIT_E2E" "$PY" -m shardscribe.jobs.cli bench e2e "${E2E_ARGS[@]}" --config ar --model "$WORK/turbo" \
    --set "model.dtype=$E2E_DTYPE" --set decoder.max_new_tokens=48 --out "$OUT/e2e_turbo.json"
step bench_e2e_parakeet_tdt "$LIMIT_E2E" "$PY" -m shardscribe.jobs.cli bench e2e "${E2E_ARGS[@]}" --config transducer_greedy \
    --model "$WORK/parakeet_tdt" --set "model.dtype=$E2E_DTYPE" --out "$OUT/e2e_parakeet_tdt.json"

job() {   # job NAME RUNNER CONFIG EXTRA-SETS...: the job on the GPU, summary to $OUT/job_NAME.json
    local name=$1 runner=$2 config=$3
    shift 3
    rm -rf "$WORK/out_$name"
    local sets=()
    local dtype=float32
    [ "$DEVICE" = cuda ] && dtype=bfloat16
    for s in "model.device=$DEVICE" "model.dtype=$dtype" "model.ctc_head=$WORK/head" "decoder.max_new_tokens=48" "$@"; do
        sets+=(--set "$s")
    done
    step "job_$name" "$LIMIT_JOB" "$PY" -m shardscribe.jobs.cli transcribe --input "$WORK/clips.jsonl" --output "$WORK/out_$name" \
        --config "$config" --model "$WORK/turbo" --runner "$runner" --progress-interval 0 "${sets[@]}"
    cp "$WORK/out_$name/__shardscribe__/summary.json" "$OUT/job_$name.json" 2>/dev/null || true
}
# Blocks of 4 recordings: every row of a random head is rejected, so unpooled calls get a
# block's 4 rows, pooled ones the budget's 16 (24000 / 1500 encoder frames).
job ar local ar batching.recordings_per_batch=4
job ssd_pooled local ssd batching.recordings_per_batch=4
job ssd_unpooled local ssd batching.recordings_per_batch=4 second_stage.pooled=false
# 5. Ray on the one GPU, beside the in-process runner's `ar` above (same clips and keys).
step ray_import 30 "$PY" -c "import ray; print(ray.__version__)"
if "$PY" -c "import ray" 2>/dev/null; then
    job ar_ray ray ar batching.recordings_per_batch=4
fi

"$PY" - "$OUT" <<'EOF'
"""One results.json: the steps, the bench's summary, each job's second-stage counts."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
result = {"steps": [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]}
for name in ("env", "regimes", "e2e_turbo", "e2e_parakeet_tdt", "job_ar", "job_ssd_pooled", "job_ssd_unpooled",
             "job_ar_ray"):
    path = out / f"{name}.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError:   # a step that failed before writing its JSON: its log says why
            continue
        if name == "regimes":
            data = data.get("summary", data)
        elif name.startswith("e2e_"):
            data = {k: v for k, v in data.get("summary", {}).items() if k != "texts"} | {"rows": data.get("rows")}
        elif name.startswith("job_"):
            data = {k: data.get(k) for k in ("rows_in", "rows_out", "errors", "wall_seconds", "rtfx",
                                             "second_stage", "stages", "cluster") if k in data}
        result[name] = data
local, ray_job = result.get("job_ar", {}), result.get("job_ar_ray", {})
if local.get("rtfx") and ray_job.get("rtfx"):
    result["ray_over_local"] = round(ray_job["rtfx"] / local["rtfx"], 3)
(out / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
print(json.dumps(result, default=str)[:4000])
EOF
