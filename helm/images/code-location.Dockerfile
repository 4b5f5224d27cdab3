# Code location image: the Dagster definitions (pipelines/, assets/, resources/, ops/) served by
# `dagster api grpc -m pipelines.definitions`, also used for run and step pods. Build from the
# repository root, at the commit the training image is built from:
#   docker build $(python -m core.code_version --build-args) \
#     -f helm/images/code-location.Dockerfile -t <registry>/code-location:<sha> .
# The image has no .git: core.code_version reads the GIT_SHA/GIT_DIRTY recorded in BUILD.json,
# and the launcher passes that version to the training pods, which compare it with theirs.
# Steps only orchestrate (training runs in the training image), so torch is the CPU build.
ARG PYTHON_BASE=python:3.11-slim-bookworm
FROM ${PYTHON_BASE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/model-factory
# Dependencies first, from the lock (helm/images/code-location.lock.txt: pyproject.toml's
# dependencies resolved under constraints.txt's pins, every distribution pinned; `make images-lock`),
# in a layer of their own: a commit that changes only code rebuilds the small layers below, not
# this one. As in the training image: everything but torch from PyPI with no resolution of its own
# (--no-deps: the lock is the resolution), then the lock's torch pin from the CPU index,
# constrained by the rest; `pip check` fails the build if the halves disagree.
COPY helm/images/code-location.lock.txt /opt/model-factory/requirements.lock.txt
RUN grep -v '^torch==' /opt/model-factory/requirements.lock.txt > /tmp/deps.lock \
 && grep '^torch==' /opt/model-factory/requirements.lock.txt > /tmp/torch.lock \
 && pip install --no-deps -r /tmp/deps.lock \
 && pip install --index-url "${TORCH_INDEX_URL}" -c /tmp/deps.lock -r /tmp/torch.lock \
 && pip check \
 && rm /tmp/deps.lock /tmp/torch.lock

# The run and step pods run as 1000:1000 (resources/k8s/step_config.py). Debian's slim base has
# no user at 1000 today; the script replaces one should a future base bring it, as Ubuntu's does.
COPY helm/images/runtime-user.sh /usr/local/sbin/runtime-user.sh
RUN sh /usr/local/sbin/runtime-user.sh --create-home dagster 1000 \
 && mkdir -p "${DAGSTER_HOME}" && chown 1000:1000 "${DAGSTER_HOME}"

# Then the platform's own package, with no dependency of its own (the lock installed them all) and
# with the lock's setuptools as its build backend (nothing fetched unpinned at build time).
COPY pyproject.toml constraints.txt README.md ./
COPY pipelines/ ./pipelines/
COPY assets/ ./assets/
COPY resources/ ./resources/
COPY ops/ ./ops/
COPY core/ ./core/
COPY teams/ ./teams/
COPY training_runtime/ ./training_runtime/
RUN pip install --no-deps --no-build-isolation . && pip check

# What the image holds (pip's installation report of every distribution), as the training image's.
RUN pip inspect > /opt/model-factory/SBOM.pip-inspect.json

# The code version, last (see the top); where core.code_version looks when git is absent.
ARG GIT_SHA
ARG GIT_DIRTY
ENV MODEL_FACTORY_BUILD_INFO=/opt/model-factory/BUILD.json
RUN python -m training_runtime.observe.build_info --git-sha "${GIT_SHA}" --dirty "${GIT_DIRTY}" \
      --out /opt/model-factory/BUILD.json
LABEL org.opencontainers.image.revision="${GIT_SHA}" \
      io.model-factory.git-dirty="${GIT_DIRTY}"

USER 1000:1000
EXPOSE 3030
CMD ["dagster", "api", "grpc", "-m", "pipelines.definitions", "-h", "0.0.0.0", "-p", "3030"]
