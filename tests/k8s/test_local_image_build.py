"""The pure parts of helm/images/local_build.py (no buildah needed): the local torch index's pages
and the cache key of an image, which changes with what the image copies and nothing else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("local_build", REPO / "helm/images/local_build.py")
local_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_build)


def test_the_index_has_a_page_per_normalized_project_linking_its_wheels(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "typing_extensions-4.16.0-py3-none-any.whl",
                 "MarkupSafe-3.0.4-cp311-cp311-manylinux2014_x86_64.whl"):
        (wheels / name).write_bytes(b"")
    local_build.write_index(wheels, tmp_path / "simple")
    assert sorted(p.name for p in (tmp_path / "simple").iterdir()) == ["markupsafe", "torch", "typing-extensions"]
    page = (tmp_path / "simple/torch/index.html").read_text()
    assert '<a href="/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl">' in page


def test_the_cache_key_follows_the_images_inputs_and_build_arguments(tmp_path, monkeypatch):
    args = {"GIT_SHA": "abc", "GIT_DIRTY": "false", "CUDA_BASE": "localhost/base",
            "TORCH_INDEX_URL": f"http://127.0.0.1:{local_build.INDEX_PORT}/simple"}
    key = local_build.build_key("training", args)
    # the local stand-in's address (its port taken when the usual one is busy): not part of the key
    assert local_build.build_key("training", {**args, "TORCH_INDEX_URL": "http://127.0.0.1:40111/simple"}) == key
    # another index (--torch-index: PyPI's CUDA build) makes another image
    assert local_build.build_key("training", {**args, "TORCH_INDEX_URL": "https://pypi.org/simple"}) != key
    assert local_build.build_key("training", {**args, "GIT_SHA": "def"}) != key
    # a file the training image copies changes its key; the code location's inputs are others
    fake = tmp_path / "repo"
    for inp in ("helm/images/training.Dockerfile", "helm/images/training.lock.txt", "helm/images/training.cuda.lock.txt",
                "helm/images/runtime-user.sh",
                "training_runtime/a.py", "teams/b.py"):
        (fake / inp).parent.mkdir(parents=True, exist_ok=True)
        (fake / inp).write_text("x")
    monkeypatch.setattr(local_build, "REPO", fake)
    before = local_build.build_key("training", args)
    (fake / "training_runtime/a.py").write_text("y")
    assert local_build.build_key("training", args) != before
    before = local_build.build_key("training", args)
    (fake / "helm/images/training.lock.txt").write_text("torch==2.13.1\n")  # the lock is an input too
    assert local_build.build_key("training", args) != before
    (fake / "training_runtime/__pycache__").mkdir()
    (fake / "training_runtime/__pycache__/a.pyc").write_text("z")
    after = local_build.build_key("training", args)
    (fake / "training_runtime/__pycache__/a.pyc").write_text("zz")
    assert local_build.build_key("training", args) == after  # bytecode caches are not inputs


def test_the_local_index_serves_the_torch_the_lock_pins(tmp_path):
    lock = tmp_path / "training.lock.txt"
    lock.write_text("numpy==2.4.6\n    # via torch\ntorch==2.13.0\n")
    assert local_build.torch_version(lock) == "2.13.0"
    lock.write_text("numpy==2.4.6\n")
    import pytest

    with pytest.raises(local_build.BuildError, match="make images-lock"):
        local_build.torch_version(lock)
