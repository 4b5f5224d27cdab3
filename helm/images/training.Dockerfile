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

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

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

# Installed from the lock (helm/images/training.lock.txt, every distribution pinned; made from
# training.requirements.in, which says why each package is here): first everything but torch, from
# PyPI with no resolution of its own (--no-deps: the lock is the resolution), then the lock's torch
# pin from the CUDA wheel index, constrained by the rest of the lock, which brings only that build's
# own CUDA, cuDNN and NCCL packages (nvidia-*, cuda-*, triton), under the CUDA lock's pins
# (training.cuda.lock.txt: PyPI's CUDA build pins some of them only with ranges; the file names
# nothing a CPU build installs). `pip check` fails the build if the halves disagree. Both locks stay
# in the image beside the SBOM.
COPY helm/images/training.lock.txt /opt/model-factory/requirements.lock.txt
COPY helm/images/training.cuda.lock.txt /opt/model-factory/requirements.cuda.lock.txt
RUN grep -v '^torch==' /opt/model-factory/requirements.lock.txt > /tmp/deps.lock \
 && grep '^torch==' /opt/model-factory/requirements.lock.txt > /tmp/torch.lock \
 && pip install --no-deps -r /tmp/deps.lock \
 && pip install --index-url "${TORCH_INDEX_URL}" -c /tmp/deps.lock \
      -c /opt/model-factory/requirements.cuda.lock.txt -r /tmp/torch.lock \
 && pip check \
 && rm /tmp/deps.lock /tmp/torch.lock

# What the image holds, for its supply chain: pip's own installation report (name, version,
# metadata with the license, requirements and origin of every installed distribution), next to
# BUILD.json and the lock; `make images` copies both out beside the image.
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
