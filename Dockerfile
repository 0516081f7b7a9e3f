# The shardscribe image that docs/cluster/rayjob.yaml runs, head and workers alike, built
# from this repository the way the README installs it (scripts/setup.sh), from the
# repository's root:
#
#   docker build -t REGISTRY/shardscribe:0.1.0 .
#
# The tag is the project's version (pyproject.toml); REGISTRY is yours. Ray is pinned to
# the RayJob's rayVersion: KubeRay needs the same Ray in the image as the cluster it runs.
#
# CPU torch by default, as scripts/setup.sh installs it (a plain `pip install torch` pulls
# a ~5 GB CUDA build). GPU variant: torch's CUDA build, from the PyTorch index of a CUDA
# version your nodes' driver supports (PyTorch's install selector lists them; the wheels
# bring the CUDA runtime, the NVIDIA container runtime the driver), e.g.
#
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#       -t REGISTRY/shardscribe:0.1.0-cuda .
#
# and jobs with --set model.device=cuda on pods that ask for a GPU
# (docs/cluster/rayjob.yaml says what to change).
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG RAY_VERSION=2.60.0

# wget: KubeRay's default readiness and liveness probes call it inside the Ray containers.
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/shardscribe
COPY . .

# torch first, from the index chosen above: scripts/setup.sh keeps a torch that is there.
# setup.sh then installs the runtime's Debian packages (a C compiler for the beam search's
# native loop, libsndfile) and the project into .venv; the extras add the S3 backend and
# Ray's job server and dashboard at the cluster's version.
RUN python -m venv .venv \
    && .venv/bin/python -m pip install -q --no-cache-dir --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION" \
    && bash scripts/setup.sh \
    && .venv/bin/python -m pip install -q --no-cache-dir -e ".[s3,cluster]" "ray[default,data]==$RAY_VERSION" \
    && rm -rf /var/lib/apt/lists/* /root/.cache/pip

ENV PATH=/opt/shardscribe/.venv/bin:$PATH
# Not root: the Ray processes and the job need no privileges. What shardscribe builds once
# per machine goes to the user's cache (pipeline/cache.py): ~/.cache/shardscribe.
RUN useradd --create-home --uid 1000 ray
USER ray
# The README's quick start on the bundled samples, in process: the image is checked as it
# is built, and the embedded model's one-time conversion is in the image's cache, not
# redone by every pod.
RUN shardscribe transcribe --input pipeline/assets/samples/samples.jsonl --output /tmp/smoke --runner local \
        --quiet \
    && rm -rf /tmp/smoke
CMD ["shardscribe", "--help"]
