"""The images' locks (helm/images/training.lock.txt from training.requirements.in, and
helm/images/code-location.lock.txt from pyproject.toml and code-location.requirements.in under
constraints.txt; both made by helm/images/lock.py): the comparison of a built image's SBOM with its
lock, on made-up reports (make test-images runs it on the built images'), and the committed locks
against what they were made from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("image_lock", REPO / "helm/images/lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

LOCK = """\
# a comment
numpy==2.4.6 ; python_full_version < '3.12'
numpy==2.5.5 ; python_full_version >= '3.12'
    # via -r requirements.in
torch==2.13.0
pip==26.3
"""


def _sbom(*dists: tuple[str, str, list[str]]) -> dict:
    return {"version": "1", "installed": [{"metadata": {"name": n, "version": v, "requires_dist": r}}
                                          for n, v, r in dists]}


def test_an_image_holding_only_what_its_lock_pins_passes():
    # torch's build label (+cpu, +cu128) is the index's choice; the pin is without it
    sbom = _sbom(("numpy", "2.4.6", []), ("torch", "2.13.0+cpu", ["numpy"]), ("pip", "26.3", []))
    assert lock.unlocked(sbom, LOCK) == []


def test_a_package_outside_the_lock_or_at_another_version_is_named():
    sbom = _sbom(("numpy", "2.4.7", []), ("torch", "2.13.0", []), ("pip", "26.3", []), ("Requests", "2.33.0", []))
    assert lock.unlocked(sbom, LOCK) == ["numpy 2.4.7 (the lock pins ==2.4.6 or ==2.5.5)",
                                         "Requests 2.33.0 (not in the lock)"]


def test_a_cuda_builds_own_libraries_pass_only_at_the_version_the_locked_torch_pins():
    requires = ["nvidia-nccl-cu12==2.27.3; platform_system == 'Linux'", "triton==3.4.0", "sympy>=1.13.3",
                "opt-einsum>=3.3; extra == 'opt-einsum'"]
    ok = _sbom(("torch", "2.13.0+cu128", requires), ("nvidia-nccl-cu12", "2.27.3", []), ("triton", "3.4.0", []),
               ("pip", "26.3", []))
    assert lock.unlocked(ok, LOCK) == []
    other = _sbom(("torch", "2.13.0+cu128", requires), ("nvidia-nccl-cu12", "2.28.0", []), ("sympy", "1.14.0", []))
    assert lock.unlocked(other, LOCK) == ["nvidia-nccl-cu12 2.28.0 (not in the lock)", "sympy 1.14.0 (not in the lock)"]
    # an unlocked torch vouches for nothing
    stray = _sbom(("torch", "2.12.0+cu128", requires), ("triton", "3.4.0", []))
    assert lock.unlocked(stray, LOCK) == ["torch 2.12.0+cu128 (the lock pins ==2.13.0)", "triton 3.4.0 (not in the lock)"]


def test_the_committed_lock_satisfies_every_requirement_it_was_made_from():
    requirements = (REPO / "helm/images/training.requirements.in").read_text()
    committed = (REPO / "helm/images/training.lock.txt").read_text()
    assert lock.unsatisfied(requirements, committed) == [], "run `make images-lock` and commit the lock"
    assert lock.unsatisfied("numpy>=99\n", committed) == ["numpy>=99 (lock: ==2.4.6)"]
    pins = lock.parse_lock(committed)
    assert all(len(reqs) == 1 and str(reqs[0].specifier).startswith("==") for reqs in pins.values())
    assert "torch==2.13.0\n" in committed  # without a build label: the index decides CPU or CUDA
    assert not [n for n in pins if n.startswith(("nvidia-c", "nvidia-n", "triton", "cuda-"))]


def test_the_code_location_lock_satisfies_the_packages_dependencies_and_constraints():
    import tomllib

    committed = (REPO / "helm/images/code-location.lock.txt").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = (REPO / "helm/images/code-location.requirements.in").read_text()
    assert lock.unsatisfied("\n".join(project["dependencies"]) + "\n" + extra, committed) == [], \
        "pyproject.toml's dependencies moved: run `make images-lock` and commit the lock"
    # constraints.txt's exact pins hold in the image wherever the image has the package: the image runs
    # what `make install` tests
    pins = lock.parse_lock(committed)
    constrained = [l.split("#", 1)[0].strip() for l in (REPO / "constraints.txt").read_text().splitlines()]
    inside = "\n".join(l for l in constrained if l and lock.canonicalize_name(lock.Requirement(l).name) in pins)
    assert lock.unsatisfied(inside, committed) == [], "constraints.txt moved: run `make images-lock` and commit the lock"
    assert {"dagster", "torch", "setuptools", "pip"} <= set(pins) and "pytest" not in pins  # no dev extras
    assert "torch==2.13.0\n" in committed
    assert all(len(reqs) == 1 and str(reqs[0].specifier).startswith("==") for reqs in pins.values())


def test_the_cuda_lock_pins_only_what_torchs_cuda_build_adds_to_the_training_lock():
    """training.cuda.lock.txt: what PyPI's CUDA torch brings beyond the training lock, every one an
    exact pin, nothing the CPU lock pins too (the Dockerfile installs torch under both)."""
    cuda = (REPO / "helm/images/training.cuda.lock.txt").read_text()
    cpu = (REPO / "helm/images/training.lock.txt").read_text()
    pins, cpu_pins = lock.parse_lock(cuda), lock.parse_lock(cpu)
    assert pins and not set(pins) & set(cpu_pins) and "torch" not in pins
    assert all(n.startswith(("nvidia-", "cuda-", "triton")) for n in pins), sorted(pins)
    assert all(len(reqs) == 1 and str(reqs[0].specifier).startswith("==") for reqs in pins.values())
    assert "torch==2.13.0's CUDA build" in cuda.replace("\n# ", " ")
    # an image with a CUDA torch holds exactly the two locks: a floating library (cuda-bindings is a
    # range in torch's requirements) is named unless the CUDA lock pins it at the installed version
    requires = ["cuda-bindings<14,>=13.0.3", "nvidia-nccl-cu13==2.29.7"]
    name, version = "cuda-bindings", str(pins["cuda-bindings"][0].specifier).removeprefix("==")
    sbom = _sbom(("torch", "2.13.0", requires), (name, version, []), ("nvidia-nccl-cu13", "2.29.7", []))
    assert lock.unlocked(sbom, LOCK + cuda) == []
    assert lock.unlocked(sbom, LOCK) == [f"{name} {version} (not in the lock)"]


def test_the_cuda_resolution_becomes_the_cuda_lock_only_when_it_is_a_cuda_build():
    import pytest

    cpu = "numpy==2.4.6\ntorch==2.13.0\n"
    compiled = "numpy==2.4.6\ntorch==2.13.0\n    # via -r torch.in\nnvidia-nccl-cu13==2.29.7\ntriton==3.7.1\n"
    text = lock.finish_cuda_lock(compiled, cpu, "2.13.0")
    assert text.splitlines()[-2:] == ["nvidia-nccl-cu13==2.29.7", "triton==3.7.1"]
    with pytest.raises(lock.LockError, match="not PyPI's CUDA build"):
        lock.finish_cuda_lock("numpy==2.4.6\ntorch==2.13.0+cpu\n", cpu, "2.13.0")
    with pytest.raises(lock.LockError, match="no nvidia"):
        lock.finish_cuda_lock("numpy==2.4.6\ntorch==2.13.0\n", cpu, "2.13.0")


def test_each_lock_names_what_it_was_made_from():
    assert lock.header("training").startswith("# The training image's lock")
    code = lock.header("code-location")
    assert "pyproject.toml" in code and "constraints.txt" in code
    assert all(len(line) <= 100 for line in code.splitlines())


def test_uvs_output_becomes_the_lock_only_with_torchs_cpu_build():
    compiled = "numpy==2.4.6\n    # via torch\ntorch==2.13.0+cpu\n    # via -r x.in\n"
    text = lock.finish_lock(compiled)
    assert text.startswith(lock.header("training")) and "torch==2.13.0\n" in text and "+cpu" not in text
    import pytest

    with pytest.raises(lock.LockError, match="CPU index"):
        lock.finish_lock("torch==2.13.0\n")
    with pytest.raises(lock.LockError, match="nvidia-nccl-cu13"):
        lock.finish_lock("torch==2.13.0+cpu\nnvidia-nccl-cu13==2.29.7\nnvidia-ml-py==13.615.71\n")
