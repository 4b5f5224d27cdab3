# Code location image: the Dagster definitions (pipelines/, assets/, resources/, ops/) served by
# `dagster api grpc -m pipelines.definitions`, also used for run and step pods. Build from the
# repository root:
#   docker build -f helm/images/code-location.Dockerfile -t <registry>/code-location:<sha> .
# Steps only orchestrate (training runs in the training image), so torch is the CPU build.
ARG PYTHON_BASE=python:3.11-slim-bookworm
FROM ${PYTHON_BASE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/model-factory
# Dependencies first (cached layer), with the exact pins of constraints.txt.
COPY pyproject.toml constraints.txt README.md ./
COPY pipelines/ ./pipelines/
COPY assets/ ./assets/
COPY resources/ ./resources/
COPY ops/ ./ops/
COPY training_runtime/ ./training_runtime/
# The run and step pods run as 1000:1000 (resources/k8s/step_config.py). Debian's slim base has
# no user at 1000 today; the script replaces one should a future base bring it, as Ubuntu's does.
COPY helm/images/runtime-user.sh /usr/local/sbin/runtime-user.sh
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" -c constraints.txt . \
 && sh /usr/local/sbin/runtime-user.sh --create-home dagster 1000 \
 && mkdir -p "${DAGSTER_HOME}" && chown 1000:1000 "${DAGSTER_HOME}"

USER 1000:1000
EXPOSE 3030
CMD ["dagster", "api", "grpc", "-m", "pipelines.definitions", "-h", "0.0.0.0", "-p", "3030"]
