# Training image: plain PyTorch + the runtime's few dependencies + the teams' training code, no
# Dagster (the runtime talks to the orchestrator only through dagster-pipes on stderr). Build from
# the repository root, at the commit the code location is built from:
#   docker build $(python -m core.code_version --build-args) \
#     -f helm/images/training.Dockerfile -t <registry>/training:<sha> .
# GIT_SHA and GIT_DIRTY are recorded in /opt/model-factory/BUILD.json and the image's labels; each
# training pod compares them with the orchestrator's code version before it starts
# (training_runtime/observe/build_info.py), so a stale image fails at once instead of training other code.
# USER_CODE is the package of user code (models, tasks, training functions named "pkg.module:fn")
# copied beside training_runtime/; it must import without Dagster. The default ships teams/.
#
# The base is nvidia/cuda's *base* flavour (the CUDA runtime, cudart, alone) on purpose, not
# `cudnn-runtime`: the torch CUDA wheels depend on their own CUDA libraries, cuDNN and NCCL as
# nvidia-* pip packages and load those, so the runtime flavour's copies would add gigabytes to
# every node's pull and never be used. The nvidia/cuda base still earns its place over plain
# ubuntu: its NVIDIA_REQUIRE_CUDA makes the NVIDIA container toolkit refuse, with a clear message,
# a node whose driver is too old for CUDA 12.8, and NVIDIA_DRIVER_CAPABILITIES=compute,utility
# mounts libcuda and NVML (which the runtime's telemetry reads). The CUDA version of the base and
# of the torch wheel index must agree (cu128 wheels on a 12.8 base); the host driver must support it.
ARG CUDA_BASE=nvidia/cuda:12.8.1-base-ubuntu24.04
FROM ${CUDA_BASE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG DAGSTER_PIPES_VERSION=1.13.27

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# libibverbs1 and ibverbs-providers (the mlx5 and other verbs drivers, a few MB): NCCL loads
# libibverbs at run time for its InfiniBand/RoCE transport (the chart's training.rdma profile)
# and silently falls back to TCP sockets without it. Versions are not pinned: the Ubuntu archive
# drops superseded versions, which would break rebuilds; the base image tag fixes the release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      libibverbs1 ibverbs-providers \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

# torch from the CUDA wheel index (it brings the nvidia-* CUDA, cuDNN and NCCL packages); the rest
# from PyPI. nvidia-ml-py and psutil feed the runtime's telemetry, boto3 reads s3:// shards
# (the shard cache names botocore's retry settings and urllib3's errors itself, so both are stated),
# simplejpeg and pillow decode image shards in the loader, torchmetrics computes the tasks'
# metrics, safetensors writes the weights, onnx and onnxruntime export and check the model,
# tokenizers reads a language model's tokenizer, tensorboard writes the run's event files.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && pip install "numpy>=2.0" "boto3>=1.34" "botocore>=1.34" "urllib3>=1.26" "nvidia-ml-py>=12" "psutil>=5.9" "simplejpeg>=1.7" "pillow>=10" \
      "torchmetrics>=1.4" "safetensors>=0.4" "onnx>=1.16" "onnxruntime>=1.18" "tokenizers>=0.15.1" \
      "tensorboard>=2.16" "dagster-pipes==${DAGSTER_PIPES_VERSION}"

# What the image holds, for its supply chain: pip's own installation report (name, version,
# metadata with the license, requirements and origin of every installed distribution), next to
# BUILD.json; `make images` copies it out beside the image.
RUN mkdir -p /opt/model-factory && pip inspect > /opt/model-factory/SBOM.pip-inspect.json

WORKDIR /opt/model-factory
COPY training_runtime/ ./training_runtime/
ENV PYTHONPATH=/opt/model-factory

# After the dependencies, so a code change rebuilds only small layers. No defaults for the version:
# an image that does not say what it was built from could never pass the pods' code-version check.
ARG USER_CODE=teams
ARG GIT_SHA
ARG GIT_DIRTY
COPY ${USER_CODE}/ ./${USER_CODE}/
RUN python -m training_runtime.observe.build_info --git-sha "${GIT_SHA}" --dirty "${GIT_DIRTY}" \
      --user-code "${USER_CODE}" --out /opt/model-factory/BUILD.json
LABEL org.opencontainers.image.revision="${GIT_SHA}" \
      io.model-factory.git-dirty="${GIT_DIRTY}" \
      io.model-factory.user-code="${USER_CODE}"

# Matches the pods' securityContext (runAsUser/runAsGroup 1000, read-only root filesystem: HOME
# and caches point at the /tmp emptyDir the manifest mounts). The base's own user at 1000
# (`ubuntu` on Ubuntu 24.04) is replaced, see the script.
COPY helm/images/runtime-user.sh /usr/local/sbin/runtime-user.sh
RUN sh /usr/local/sbin/runtime-user.sh trainer 1000
USER 1000:1000

# The Job's command runs `torchrun ... -m training_runtime --config <file>`; this default only
# makes `docker run <image>` print the runtime's usage.
CMD ["python", "-m", "training_runtime", "--help"]
