"""Checks of the Dockerfiles that need no build (make test-images builds and runs them): the
training image installs every third-party module training_runtime imports and not Dagster,
takes its CUDA base as a build argument, and both images run as the non-root user the pod
security contexts expect."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from resources.k8s.manifests import PodSettings

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "helm" / "images"
# Import name -> PyPI name where they differ.
PYPI_NAME = {"pynvml": "nvidia-ml-py", "dagster_pipes": "dagster-pipes", "PIL": "pillow"}


# training_runtime modules only the evaluate step runs, in the code-location image (ops/evaluation.py:
# the ONNX export and its check, a language model's text samples): the training image leaves out
# what only they import (onnx, onnxruntime, tokenizers), which a training step never imports.
CODE_LOCATION_ONLY = ("serve/export.py", "serve/text_samples.py")


def _modules(skip: tuple[str, ...] = ()):
    for path in sorted((REPO / "training_runtime").rglob("*.py")):
        if path.relative_to(REPO / "training_runtime").as_posix() not in skip:
            yield path, ast.parse(path.read_text())


def runtime_third_party_imports(skip: tuple[str, ...] = CODE_LOCATION_ONLY) -> set[str]:
    """Third-party top-level modules that training_runtime imports, less the code-location-only modules'."""
    names: set[str] = set()
    for _, tree in _modules(skip):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("training_runtime", "__future__")}


def requirement_names(text: str) -> set[str]:
    """Distribution names of a requirements file's lines."""
    lines = (l.split("#", 1)[0].strip() for l in text.splitlines())
    return {re.split(r"[=<>!~\[; ]", l)[0].lower() for l in lines if l}


def test_training_image_installs_exactly_the_runtime_dependencies():
    """The image installs its lock, made from training.requirements.in (tests/k8s/test_image_lock.py
    holds the lock to that file; the Dockerfile installs the lock alone)."""
    dockerfile = (IMAGES / "training.Dockerfile").read_text()
    assert "pip install --no-deps -r /tmp/deps.lock" in dockerfile and "COPY helm/images/training.lock.txt" in dockerfile
    wanted = {PYPI_NAME.get(m, m).lower() for m in runtime_third_party_imports()}
    installed = requirement_names((IMAGES / "training.requirements.in").read_text())
    assert wanted <= installed, f"missing from the training image: {sorted(wanted - installed)}"
    assert "dagster" not in installed  # dagster-pipes only: the runtime never imports dagster
    # onnx: torch.onnx.export imports it itself, so no runtime module names it; likewise tensorboard,
    # which torch.utils.tensorboard's SummaryWriter imports; pip: the venv's installer, pinned too
    assert installed <= wanted | {"torch", "numpy", "boto3", "psutil", "nvidia-ml-py", "dagster-pipes",
                                  "tensorboard", "pip"}


def test_no_training_path_imports_the_modules_the_training_image_leaves_out():
    """serve/export.py and serve/text_samples.py import onnxruntime and tokenizers, which the
    training image does not hold: nothing else of training_runtime may import them."""
    left_out = {"training_runtime." + m.removesuffix(".py").replace("/", ".") for m in CODE_LOCATION_ONLY}
    importers = []
    for path, tree in _modules(CODE_LOCATION_ONLY):
        for node in ast.walk(tree):
            named = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module else [])
            if left_out & set(named):
                importers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert importers == [], f"these would fail in the training pods (no onnx/tokenizers there): {importers}"
    assert {"onnxruntime", "tokenizers"} <= runtime_third_party_imports(skip=())  # what the exclusion is about


def test_training_image_takes_its_cuda_base_as_a_build_argument():
    lines = [l for l in (IMAGES / "training.Dockerfile").read_text().splitlines() if l and not l.startswith("#")]
    assert lines[0].startswith("ARG CUDA_BASE=nvidia/cuda:")
    assert lines[1] == "FROM ${CUDA_BASE}"


def test_images_run_as_the_pods_non_root_user():
    uid = PodSettings(namespace="n", image="i").run_as_user
    for name in ("training.Dockerfile", "code-location.Dockerfile"):
        users = re.findall(r"^USER (\S+)", (IMAGES / name).read_text(), flags=re.M)
        assert users and users[-1] == f"{uid}:{uid}", name


def test_code_location_image_serves_the_definitions_module():
    text = (IMAGES / "code-location.Dockerfile").read_text()
    assert '"-m", "pipelines.definitions"' in text
    assert (REPO / "pipelines" / "definitions.py").exists()
    # its dependencies from its lock, in a layer above every COPY of code: a commit that changes only
    # code reuses the dependency layer (tests/k8s/test_image_lock.py holds the lock to pyproject.toml)
    lock = text.index("COPY helm/images/code-location.lock.txt")
    deps = text.index("pip install --no-deps -r /tmp/deps.lock")
    code = min(text.index(f"COPY {d}/") for d in ("pipelines", "assets", "resources", "ops", "core", "teams",
                                                   "training_runtime"))
    assert lock < deps < code < text.index("pip install --no-deps --no-build-isolation .")
