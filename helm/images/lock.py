"""The images' lock files: ``python helm/images/lock.py`` (``make images-lock``) resolves, with
``uv pip compile``,

- helm/images/training.requirements.in into helm/images/training.lock.txt (the training image);
- pyproject.toml's dependencies under constraints.txt's pins, with
  helm/images/code-location.requirements.in (the installer and the build backend the image keeps),
  into helm/images/code-location.lock.txt (the code-location image, whose own package is then
  installed with ``--no-deps``);

and ``unlocked`` names what a built image holds beyond its lock (its SBOM against the lock).

The lock is resolved for the CPU build of torch, for CPython 3.11 on manylinux x86_64 (the local
build's Debian bookworm base; the production base, Ubuntu 24.04, runs 3.12 and pip refuses at
build time any pin whose Requires-Python excludes it). It pins torch without its build label
(``torch==2.13.0``): the Dockerfile installs that pin from its TORCH_INDEX_URL, and a CUDA build's
own CUDA libraries (nvidia-*, triton, cuda-*) come with it, each pinned exactly by that torch
wheel's metadata, so the image is still fully determined by the lock and the index. ``unlocked``
accepts those and nothing else beyond the lock.

torch's CPU wheel is found as pip finds it here (``pip download``, so pip's configured wheels and
mirrors count), the rest on PyPI; where pip would fetch PyPI's default (CUDA) build, point pip at
the CPU index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and run again.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "helm/images/training.requirements.in"
LOCK = REPO / "helm/images/training.lock.txt"
# image -> (the inputs uv resolves, the constraints it resolves them under, the lock it writes)
LOCKS = {
    "training": ((REQUIREMENTS,), (), LOCK),
    "code-location": ((REPO / "pyproject.toml", REPO / "helm/images/code-location.requirements.in"),
                      (REPO / "constraints.txt",), REPO / "helm/images/code-location.lock.txt"),
}
PYTHON_VERSION, PLATFORM = "3.11", "x86_64-manylinux_2_28"
HEADER = ("The {image} image's lock: every distribution it installs, pinned. Generated from {inputs} by "
          "`make images-lock` (helm/images/lock.py) for CPython 3.11, manylinux x86_64, with torch's CPU build; "
          "do not edit by hand. torch is pinned without its build label: the Dockerfile takes it from "
          "TORCH_INDEX_URL ({torch_index}).")
TORCH_INDEX = {"training": "CUDA in production, CPU here", "code-location": "the CPU build, here and in production"}


def header(image: str) -> str:
    inputs, constraints, _ = LOCKS[image]
    named = " and ".join(p.relative_to(REPO).as_posix() for p in inputs)
    if constraints:
        named += " under " + ", ".join(p.relative_to(REPO).as_posix() for p in constraints)
    text = HEADER.format(image=image, inputs=named, torch_index=TORCH_INDEX[image])
    return textwrap.fill(text, width=100, initial_indent="# ", subsequent_indent="# ",
                         break_on_hyphens=False) + "\n"


class LockError(RuntimeError):
    pass


def parse_lock(text: str) -> dict[str, list[Requirement]]:
    """A requirements file of pins (``name==version [; marker]``, comments, ``# via`` lines) as
    canonical name -> its lines (several where a distribution is pinned apart per environment)."""
    pins: dict[str, list[Requirement]] = {}
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        req = Requirement(line)
        pins.setdefault(canonicalize_name(req.name), []).append(req)
    return pins


def _pinned(reqs: list[Requirement], version: str) -> bool:
    return any(r.specifier.contains(Version(version), prereleases=True) for r in reqs)


def _pins(reqs: list[Requirement] | None) -> str:
    return " or ".join(str(r.specifier) for r in reqs) if reqs else "absent"


def installed(sbom: dict) -> dict[str, dict]:
    """pip inspect's report as canonical name -> its metadata (name, version, requires_dist)."""
    return {canonicalize_name(d["metadata"]["name"]): d["metadata"] for d in sbom["installed"]}


def unlocked(sbom: dict, lock_text: str) -> list[str]:
    """What the image (``pip inspect``'s report ``sbom``) holds that its lock does not pin: a
    distribution the lock does not name, or at another version than its pin. A distribution that
    a locked one requires at exactly its installed version (a CUDA torch build's nvidia-* and
    triton) is determined by that pin and passes. Empty when the image is what the lock says."""
    pins = parse_lock(lock_text)
    image = installed(sbom)
    exact: dict[str, set[str]] = {}  # name -> versions a locked, installed distribution pins with ==
    for name, meta in image.items():
        if name not in pins or not _pinned(pins[name], meta["version"]):
            continue
        for line in meta.get("requires_dist") or []:
            req = Requirement(line)
            if req.marker is not None and "extra" in str(req.marker):
                continue
            for spec in req.specifier:
                if spec.operator in ("==", "==="):
                    exact.setdefault(canonicalize_name(req.name), set()).add(spec.version)
    problems = []
    for name, meta in sorted(image.items()):
        version = meta["version"]
        if name in pins:
            if not _pinned(pins[name], version):
                problems.append(f"{meta['name']} {version} (the lock pins {_pins(pins[name])})")
        elif version not in exact.get(name, ()):
            problems.append(f"{meta['name']} {version} (not in the lock)")
    return problems


def unsatisfied(requirements_text: str, lock_text: str) -> list[str]:
    """Lines of the requirements file whose distribution the lock does not pin within their range:
    the lock is older than the file and must be generated again."""
    pins = parse_lock(lock_text)
    problems = []
    for raw in requirements_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        pin = pins.get(canonicalize_name(req.name)) or []
        versions = [s.version for r in pin for s in r.specifier if s.operator == "=="]
        if not versions or not any(req.specifier.contains(Version(v), prereleases=True) for v in versions):
            problems.append(f"{line} (lock: {_pins(pin)})")
    return problems


def finish_lock(compiled: str, image: str = "training") -> str:
    """uv's output as the committed lock: our header, and torch's pin without its build label."""
    body = "\n".join(l for l in compiled.splitlines() if not l.startswith("#    uv pip compile"))
    body, n = re.subn(r"^torch==([0-9][^+\s;]*)\+cpu\b", r"torch==\1", body, flags=re.M)
    if n != 1:
        raise LockError("the resolution did not pick torch's CPU build (torch==<version>+cpu): point pip at the CPU "
                        "index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and run again")
    # nvidia-ml-py is NVML's Python binding (the telemetry's, named in the requirements), no CUDA library
    cuda = [n for n in re.findall(r"^((?:nvidia-|triton|cuda-)[^=\s]*)==", body, flags=re.M) if n != "nvidia-ml-py"]
    if cuda:
        raise LockError(f"the lock would pin CUDA libraries ({', '.join(cuda)}): torch's CUDA build was resolved; "
                        "they must come with the torch build of TORCH_INDEX_URL, not from the lock")
    return header(image) + body.strip() + "\n"


def torch_pin(image: str) -> str:
    """The torch version the image's inputs pin (torch==X in its requirements or constraints)."""
    inputs, constraints, _ = LOCKS[image]
    for path in (*inputs, *constraints):
        if path.suffix == ".toml":
            continue
        for line in path.read_text().splitlines():
            if line.startswith("torch=="):
                return line.split("==", 1)[1].split("#", 1)[0].strip()
    raise LockError(f"the {image} image's inputs pin no torch==<version>: the lock needs the exact CPU build")


def compile_lock(image: str = "training") -> str:
    inputs, constraints, _ = LOCKS[image]
    with tempfile.TemporaryDirectory(prefix="mf-lock-") as work:
        version = torch_pin(image)
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "--dest", work, f"torch=={version}"], capture_output=True, text=True)
        if got.returncode != 0:
            raise LockError(f"pip download torch=={version} failed:\n{got.stderr[-2000:]}")
        env = dict(os.environ)
        if os.environ.get("PIP_CERT"):  # uv reads no pip settings; the proxy's CA, where there is one
            env.setdefault("SSL_CERT_FILE", os.environ["PIP_CERT"])
        constrain = [a for c in constraints for a in ("-c", str(c))]
        proc = subprocess.run([sys.executable, "-m", "uv", "pip", "compile", *map(str, inputs), *constrain, "--quiet",
                               "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
                               "--find-links", work, "--index-strategy", "unsafe-best-match", "--no-header"],
                              capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode != 0:
            raise LockError(f"uv pip compile failed (make install puts uv in .venv):\n{proc.stderr[-3000:]}")
        return finish_lock(proc.stdout, image)


CUDA_LOCK = REPO / "helm/images/training.cuda.lock.txt"
CUDA_INDEX = "https://pypi.org/simple"  # PyPI's torch wheels for Linux are its CUDA build
CUDA_HEADER = ("The training image's CUDA additions: the distributions that torch=={version}'s CUDA build on PyPI "
               "brings beyond helm/images/training.lock.txt (its nvidia-*, cuda-* and triton), pinned. Its "
               "requirements do not pin them all exactly (cuda-toolkit's extras pin with .*, cuda-bindings and "
               "nvidia-nvjitlink take ranges), so without this file the image would take whatever PyPI had on the "
               "day. The Dockerfile installs torch under these constraints, which name nothing a CPU build installs. "
               "Generated by `make images-lock` (helm/images/lock.py) for CPython 3.11, manylinux x86_64; do not "
               "edit by hand.")


def finish_cuda_lock(compiled: str, cpu_lock: str, version: str) -> str:
    """uv's resolution of ``torch==version`` from PyPI (under the CPU lock's pins) as the CUDA lock:
    the pins the CPU lock does not already hold, torch's own excepted (the lock pins it)."""
    cpu = parse_lock(cpu_lock)
    resolved = parse_lock(compiled)
    torch = [str(r.specifier) for r in resolved.get("torch", [])]
    if not torch or any("+cpu" in t for t in torch):
        raise LockError(f"the CUDA resolution picked torch {torch or 'nothing'}, not PyPI's CUDA build: "
                        "point the resolution at PyPI with no local wheels of torch's CPU build")
    extra = {name: reqs for name, reqs in resolved.items() if name not in cpu and name != "torch"}
    if not any(name.startswith("nvidia-") for name in extra):
        raise LockError(f"torch=={version} from PyPI brought no nvidia-* library: not a CUDA build")
    body = "".join(f"{reqs[0].name}{reqs[0].specifier}\n" for name, reqs in sorted(extra.items()))
    text = CUDA_HEADER.format(version=version)
    return textwrap.fill(text, width=100, initial_indent="# ", subsequent_indent="# ",
                         break_on_hyphens=False) + "\n" + body


def compile_cuda_lock() -> str:
    version = torch_pin("training")
    with tempfile.TemporaryDirectory(prefix="mf-cuda-lock-") as work:
        wanted = Path(work) / "torch.in"
        wanted.write_text(f"torch=={version}\n")
        env = dict(os.environ)
        if os.environ.get("PIP_CERT"):
            env.setdefault("SSL_CERT_FILE", os.environ["PIP_CERT"])
        proc = subprocess.run([sys.executable, "-m", "uv", "pip", "compile", str(wanted), "-c", str(LOCK), "--quiet",
                               "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
                               "--index-url", CUDA_INDEX, "--no-header"],
                              capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode != 0:
            raise LockError(f"uv pip compile of torch's CUDA build failed:\n{proc.stderr[-3000:]}")
        return finish_cuda_lock(proc.stdout, LOCK.read_text(), version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python helm/images/lock.py", description=__doc__.split("\n\n")[0])
    names = [*LOCKS, "training-cuda"]
    parser.add_argument("images", nargs="*", help=f"of {', '.join(names)} (default: all, in that order)")
    args = parser.parse_args(argv)
    if unknown := [n for n in args.images if n not in names]:
        parser.error(f"no image {', '.join(unknown)}: choose from {', '.join(names)}")
    for image in args.images or names:
        try:  # the CUDA lock last: it is resolved under the training lock just written
            text = compile_cuda_lock() if image == "training-cuda" else compile_lock(image)
        except LockError as exc:
            print(f"lock ({image}): {exc}", file=sys.stderr)
            return 1
        out = CUDA_LOCK if image == "training-cuda" else LOCKS[image][2]
        out.write_text(text)
        print(f"wrote {out.relative_to(REPO)} ({len(parse_lock(text))} distributions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
