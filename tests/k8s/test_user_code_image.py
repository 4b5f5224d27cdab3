"""User code in the training image, and the code-version check the pods run at start.

The Dockerfiles cannot be built here (no Docker engine), so each part the build runs is run here
instead: `python -m core.code_version --build-args` (what the build is given), `python -m
training_runtime.observe.build_info` (what the build runs to write BUILD.json), the user code imported
without Dagster (as the image has none), and `python -m training_runtime` in a "pod" whose
image records another commit than the run expects.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.code_version import build_args, code_version
from training_runtime.observe.build_info import (
    BUILD_INFO_ENV,
    EXPECTED_CODE_VERSION_ENV,
    IMAGE_ENV,
    CodeVersionMismatch,
    build_record,
    check_code_version,
    read_build_info,
    verify_image,
)
from training_runtime.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "helm" / "images"
SHA_A, SHA_B = "a" * 40, "b" * 40


def _write_build(path: Path, sha: str, dirty: str = "false", user_code: str = "teams") -> dict:
    """What the Dockerfile's RUN step does, run for real."""
    result = subprocess.run([sys.executable, "-m", "training_runtime.observe.build_info", "--git-sha", sha, "--dirty", dirty,
                             "--user-code", user_code, "--out", str(path)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text())


def test_the_build_records_the_code_version_it_is_given(tmp_path):
    record = _write_build(tmp_path / "BUILD.json", SHA_A, "true")
    assert record == {"git_sha": SHA_A, "dirty": True, "user_code": "teams"}
    assert read_build_info(tmp_path / "BUILD.json") == record
    assert read_build_info(tmp_path / "absent.json") is None


@pytest.mark.parametrize("sha, dirty, field", [("", "false", "GIT_SHA"), ("abc123", "false", "core.code_version"),
                                                (SHA_A, "", "GIT_DIRTY"), (SHA_A, "yes", "GIT_DIRTY")])
def test_a_build_without_a_proper_version_fails_and_says_how_to_pass_it(tmp_path, sha, dirty, field):
    result = subprocess.run([sys.executable, "-m", "training_runtime.observe.build_info", "--git-sha", sha, "--dirty", dirty,
                             "--out", str(tmp_path / "BUILD.json")], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and field in result.stderr
    assert not (tmp_path / "BUILD.json").exists()


def test_build_args_are_the_checkouts_code_version():
    version = code_version()
    if version["git_sha"] is None:
        pytest.skip("not a git checkout")
    printed = subprocess.run([sys.executable, "-m", "core.code_version", "--build-args"], cwd=REPO,
                             capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert printed == build_args(version)
    assert printed[1] == f"GIT_SHA={version['git_sha']}"
    assert printed[3] == f"GIT_DIRTY={'true' if version['dirty'] else 'false'}"
    with pytest.raises(ValueError, match="git checkout"):
        build_args({"git_sha": None, "dirty": None, "unavailable_because": "not a git checkout (OSError)"})


def test_code_version_outside_git_reads_the_images_build_record(tmp_path, monkeypatch):
    _write_build(tmp_path / "BUILD.json", SHA_B)
    monkeypatch.setenv(BUILD_INFO_ENV, str(tmp_path / "BUILD.json"))
    # tmp_path is no git checkout: as in the code-location image, which has no .git.
    assert code_version(tmp_path) == {"git_sha": SHA_B, "dirty": False, "source": "image build"}
    monkeypatch.setenv(BUILD_INFO_ENV, str(tmp_path / "absent.json"))
    assert code_version(tmp_path)["git_sha"] is None


def test_matching_versions_pass_and_mismatches_name_both_and_the_fix(tmp_path):
    where = tmp_path / "BUILD.json"
    recorded = build_record(git_sha=SHA_A, dirty=False)
    check_code_version({"git_sha": SHA_A, "dirty": False}, recorded, image="reg/training:1", where=where)
    with pytest.raises(CodeVersionMismatch) as mismatch:
        check_code_version({"git_sha": SHA_B, "dirty": False}, recorded, image="reg/training:1", where=where)
    text = str(mismatch.value)
    assert f"reg/training:1 was built from git {SHA_A}" in text and f"expects git {SHA_B}" in text
    assert "helm/images/training.Dockerfile" in text and "TRAINING_IMAGE" in text
    with pytest.raises(CodeVersionMismatch, match="dirty=True"):
        check_code_version({"git_sha": SHA_A, "dirty": True}, recorded, image=None, where=where)
    with pytest.raises(CodeVersionMismatch, match=f"records no code version .*{where.name} is missing"):
        check_code_version({"git_sha": SHA_A, "dirty": False}, None, image=None, where=where)
    with pytest.raises(CodeVersionMismatch, match="does not know its own code version"):
        check_code_version({"git_sha": None, "dirty": None, "unavailable_because": "x"}, recorded, image=None,
                           where=where)


def test_without_an_expected_version_nothing_is_checked(tmp_path):
    # A local torchrun launch: no image, no variable.
    assert verify_image({BUILD_INFO_ENV: str(tmp_path / "absent.json")}) is None
    with pytest.raises(ConfigError, match=EXPECTED_CODE_VERSION_ENV):
        verify_image({BUILD_INFO_ENV: str(tmp_path / "absent.json"), EXPECTED_CODE_VERSION_ENV: "{not json"})


def test_a_pod_with_a_stale_image_fails_at_start_naming_both_versions(tmp_path):
    """The entry point itself, as the pod runs it: it stops before reading its config."""
    _write_build(tmp_path / "BUILD.json", SHA_A)
    env = {**os.environ, BUILD_INFO_ENV: str(tmp_path / "BUILD.json"), IMAGE_ENV: "reg/training:stale",
           EXPECTED_CODE_VERSION_ENV: json.dumps({"git_sha": SHA_B, "dirty": False}), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "training_runtime", "--config", str(tmp_path / "never-read.json")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "CodeVersionMismatch" in result.stderr
    assert f"reg/training:stale was built from git {SHA_A}" in result.stderr and SHA_B in result.stderr
    assert "never-read.json" not in result.stderr


def _import_paths() -> set[str]:
    from pipelines.models import PIPELINES

    named = set()
    for spec in PIPELINES:
        for value in (spec.model, spec.train, spec.task):
            if isinstance(value, str) and ":" in value:
                named.add(value.partition(":")[0])
    return named


def _copied_packages(dockerfile: str) -> set[str]:
    """Top-level directories the training image copies: literal ones and the USER_CODE default."""
    text = (IMAGES / dockerfile).read_text()
    copied = set(re.findall(r"^COPY ([a-z_]+)/ ", text, flags=re.M))
    (user_code,) = re.findall(r"^ARG USER_CODE=(\S+)$", text, flags=re.M)
    if re.search(r"^COPY \$\{USER_CODE\}/ \./\$\{USER_CODE\}/$", text, flags=re.M):
        copied.add(user_code.split("/")[0])
    return copied


def test_every_named_user_module_is_in_the_training_image_and_imports_without_dagster():
    modules = _import_paths()
    assert modules, "no pipeline names user code by import path: this test would check nothing"
    shipped = _copied_packages("training.Dockerfile")
    assert {"training_runtime", "teams"} <= shipped
    for module in modules:
        assert module.split(".")[0] in shipped, f"{module} is not copied into the training image"
    # The image has no Dagster: importing the user code with dagster blocked must still work.
    probe = "import importlib, sys; sys.modules['dagster'] = None\n" + "".join(
        f"importlib.import_module({m!r})\n" for m in sorted(modules))
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr


def test_both_images_record_the_version_and_label_the_commit():
    for dockerfile in ("training.Dockerfile", "code-location.Dockerfile"):
        text = (IMAGES / dockerfile).read_text().replace("\\\n", " ")
        assert re.search(r"^ARG GIT_SHA$", text, flags=re.M) and re.search(r"^ARG GIT_DIRTY$", text, flags=re.M), \
            f"{dockerfile}: no default, so an unversioned build fails"
        assert re.search(r'python -m training_runtime\.observe\.build_info --git-sha "\$\{GIT_SHA\}" --dirty "\$\{GIT_DIRTY\}"',
                         text), dockerfile
        assert "/opt/model-factory/BUILD.json" in text, dockerfile
        assert 'org.opencontainers.image.revision="${GIT_SHA}"' in text, dockerfile
        # Recorded before the image drops to its runtime user (the directory is root's).
        assert text.index("training_runtime.observe.build_info") < text.rindex("USER 1000:1000"), dockerfile
    # The code location has no .git: core.code_version finds the record through this variable.
    assert f"ENV {BUILD_INFO_ENV}=/opt/model-factory/BUILD.json" in (IMAGES / "code-location.Dockerfile").read_text()
