"""Build the shipped images here, without Docker or a registry: ``python helm/images/local_build.py
[training|code-location ...] [--json FILE]`` (``make images``).

What stands in for what production pulls (the Dockerfiles' own steps are not rewritten, only their
build arguments are set):

- the base (``CUDA_BASE``): a Debian bookworm root file system made here by
  ``debootstrap --variant=minbase`` and imported into buildah's store as
  ``localhost/model-factory-base:bookworm-2`` (bookworm's python3 is 3.11); ``PYTHON_BASE``: that
  base with Python 3.11 in a virtual environment first on PATH, as python:3.11-slim-bookworm has it;
- the base trusts this machine's CA bundle (PyPI is reached through a proxy here) and sets
  ``PIP_CERT`` to it;
- ``TORCH_INDEX_URL``: a PEP 503 index served on 127.0.0.1 from the wheels ``pip download`` finds
  for torch on this machine (its CPU build and its dependencies), since download.pytorch.org cannot
  be reached; every other package comes from PyPI, as in production.

Built with ``buildah bud --isolation chroot`` (a container runtime cannot set rlimits in this
sandbox; chroot isolation runs each RUN step in the image's root as root, with the host's network).
An image is tagged with a key of the Dockerfile, the files it copies and the build arguments, and a
build whose key is already in the store is skipped: the cache. Stdlib only; needs root, buildah
and debootstrap (``apt-get install buildah debootstrap``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/model-factory-base:bookworm-2"  # -2: with the registry bases' docker-clean
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
IMAGES = {
    "training": {"dockerfile": "helm/images/training.Dockerfile", "base_arg": "CUDA_BASE", "base": "debian",
                 "inputs": ("helm/images/training.lock.txt", "helm/images/training.cuda.lock.txt", "training_runtime", "teams", "helm/images/runtime-user.sh")},
    "code-location": {"dockerfile": "helm/images/code-location.Dockerfile", "base_arg": "PYTHON_BASE", "base": "python",
                      "inputs": ("helm/images/code-location.lock.txt", "pyproject.toml", "constraints.txt", "README.md", "pipelines", "assets", "resources",
                                 "ops", "core", "teams", "training_runtime", "helm/images/runtime-user.sh")},
}
LOCK = REPO / "helm/images/training.lock.txt"


def torch_version(lock: Path = LOCK) -> str:
    """The torch the training image's lock pins (the build the local index serves)."""
    for line in lock.read_text().splitlines():
        if line.startswith("torch=="):
            return line.split("==", 1)[1].split(";")[0].strip()
    raise BuildError(f"{lock} pins no torch: run `make images-lock`")


class BuildError(RuntimeError):
    pass


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def require_tools() -> None:
    missing = [t for t in ("buildah", "debootstrap") if shutil.which(t) is None]
    if missing:
        raise BuildError(f"{', '.join(missing)} not found: apt-get install buildah debootstrap (as root)")
    if os.geteuid() != 0:
        raise BuildError("building images here needs root (debootstrap, and buildah's chroot isolation)")


def image_exists(ref: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True).returncode == 0


DOCKER_CLEAN = """\
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""


def ensure_base() -> dict:
    """The Debian base image, made once (debootstrap) and kept in buildah's store."""
    if image_exists(BASE_IMAGE):
        return {"image": BASE_IMAGE, "cached": True, "seconds": 0.0}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mf-rootfs-") as root:
        _run(["debootstrap", "--variant=minbase", SUITE, root, MIRROR])
        shutil.rmtree(Path(root) / "var/cache/apt/archives", ignore_errors=True)
        for cache in (Path(root) / "var/cache/apt").glob("*.bin"):
            cache.unlink()
        # What Debian's and Ubuntu's registry images carry: apt keeps no .deb files or package caches
        # after an install. Without it each apt-get install in a Dockerfile left ~94 MB in /var/cache.
        (Path(root) / "etc/apt/apt.conf.d/docker-clean").write_text(DOCKER_CLEAN)
        ctr = _run(["buildah", "from", "scratch"]).stdout.strip()
        try:
            mnt = _run(["buildah", "mount", ctr]).stdout.strip()
            _run(["cp", "-a", f"{root}/.", mnt])
            env = ["--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
            if HOST_CA.is_file():
                # This machine reaches PyPI through a proxy whose CA only the host trusts: the base
                # trusts the host's bundle too (kept when ca-certificates regenerates its own) and
                # points pip at it. A registry base has neither; production builds need neither.
                local = Path(mnt) / "usr/local/share/ca-certificates"
                local.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(HOST_CA, local / "model-factory-build-host.crt")
                (Path(mnt) / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(HOST_CA, Path(mnt) / "etc/ssl/certs/ca-certificates.crt")
                env += ["--env", f"PIP_CERT={HOST_CA}"]
            _run(["buildah", "umount", ctr])
            _run(["buildah", "config", *env, "--cmd", "/bin/bash", ctr])
            _run(["buildah", "commit", "--rm", ctr, BASE_IMAGE])
        except BaseException:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
            raise
    return {"image": BASE_IMAGE, "cached": False, "seconds": round(time.monotonic() - started, 1)}


# What python:3.11-slim-bookworm gives the code-location image: Python 3.11 with `python` and `pip`
# first on PATH, installing where it is told (Debian's own pip refuses to, PEP 668).
PYTHON_BASE_FILE = f"""FROM {BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \\
 && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/python
ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""
PYTHON_BASE_IMAGE = "localhost/model-factory-python-base:bookworm-2"


def ensure_python_base() -> dict:
    if image_exists(PYTHON_BASE_IMAGE):
        return {"image": PYTHON_BASE_IMAGE, "cached": True, "seconds": 0.0}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mf-python-base-") as ctx:
        (Path(ctx) / "Containerfile").write_text(PYTHON_BASE_FILE)
        _run(["buildah", "bud", "--isolation", "chroot", "-t", PYTHON_BASE_IMAGE, ctx])
    return {"image": PYTHON_BASE_IMAGE, "cached": False, "seconds": round(time.monotonic() - started, 1)}


def write_index(wheels: Path, index: Path) -> None:
    """A PEP 503 simple index of the wheels in ``wheels``: one page per normalized project name."""
    by_project: dict[str, list[Path]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        name = wheel.name.split("-")[0].lower().replace("_", "-").replace(".", "-")
        by_project.setdefault(name, []).append(wheel)
    for name, files in by_project.items():
        page = index / name
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="/wheels/{f.name}">{f.name}</a>\n' for f in files)
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        pass


# The index's URL is the TORCH_INDEX_URL build argument, which the install steps read: buildah's
# layer cache keys a RUN step by the arguments it uses, so a port that changed on every build (as a
# free port would) rebuilt the dependency layers on every commit. Below Linux's ephemeral range.
INDEX_PORT = 28173


@contextlib.contextmanager
def torch_index(work: Path) -> Iterator[str]:
    """torch and its dependencies as pip finds them here, served as an index on 127.0.0.1."""
    wheels, index = work / "wheels", work / "simple"
    wheels.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(wheels),
          f"torch=={torch_version()}"])
    write_index(wheels, index)
    handler = functools.partial(_QuietHandler, directory=str(work))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", INDEX_PORT), handler)
    except OSError as exc:  # another build serves its index there: this one's RUN layers rebuild
        print(f"local_build: port {INDEX_PORT} is taken ({exc.strerror}); the torch index takes a free port, "
              "and the layers that install from it are not reused this time", file=sys.stderr)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


def build_key(name: str, build_args: dict[str, str]) -> str:
    """What the image is made of: its Dockerfile, every file it copies, the build arguments (the
    base's and the index's stand-ins excepted: they are the same bytes on every run)."""
    spec = IMAGES[name]
    h = hashlib.sha256()
    paths = [REPO / spec["dockerfile"]]
    for inp in spec["inputs"]:
        p = REPO / inp
        paths += sorted(q for q in p.rglob("*") if q.is_file() and "__pycache__" not in q.parts) if p.is_dir() else [p]
    for p in paths:
        h.update(p.relative_to(REPO).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    # The local index's URL is the same bytes on every run; an index given with --torch-index (PyPI's
    # CUDA build) makes another image, so it is part of the key.
    local_index = build_args.get("TORCH_INDEX_URL", "").startswith("http://127.0.0.1:")
    stable = {k: v for k, v in build_args.items()
              if k != spec["base_arg"] and not (k == "TORCH_INDEX_URL" and local_index)}
    h.update(json.dumps(stable, sort_keys=True).encode())
    return h.hexdigest()[:16]


def code_version_args() -> dict[str, str]:
    out = _run([sys.executable, "-m", "core.code_version", "--build-args"], cwd=REPO).stdout.split()
    return dict(a.split("=", 1) for a in out if a != "--build-arg")


def build(name: str, index_url: str | None, *, force: bool = False) -> dict:
    spec = IMAGES[name]
    args = {**code_version_args(), spec["base_arg"]: BASE_IMAGE if spec["base"] == "debian" else PYTHON_BASE_IMAGE}
    if index_url is not None:
        args["TORCH_INDEX_URL"] = index_url
    key = build_key(name, args)
    ref = f"localhost/model-factory/{name}:{key}"
    if image_exists(ref) and not force:
        return {"name": name, "image": ref, "cached": True, "seconds": 0.0, "key": key}
    started = time.monotonic()
    cmd = ["buildah", "bud", "--isolation", "chroot", "--layers", "-f", str(REPO / spec["dockerfile"]), "-t", ref]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    _run([*cmd, str(REPO)], cwd=REPO)
    return {"name": name, "image": ref, "cached": False, "seconds": round(time.monotonic() - started, 1), "key": key}


SBOM_IN_IMAGE = "opt/model-factory/SBOM.pip-inspect.json"
LOCK_IN_IMAGE = "opt/model-factory/requirements.lock.txt"  # each image's, installed from
CUDA_LOCK_IN_IMAGE = "opt/model-factory/requirements.cuda.lock.txt"  # the training image's CUDA additions


def copy_records(ref: str, folder: Path, name: str) -> dict[str, str]:
    """The image's SBOM (pip's installation report, written by its Dockerfile) and, where it has
    one, the lock it was installed from, copied out of the image into ``folder``."""
    ctr = _run(["buildah", "from", ref]).stdout.strip()
    out = {}
    try:
        mnt = Path(_run(["buildah", "mount", ctr]).stdout.strip())
        folder.mkdir(parents=True, exist_ok=True)
        for key, inside, dest in (("sbom", SBOM_IN_IMAGE, f"{name}.sbom.json"), ("lock", LOCK_IN_IMAGE, f"{name}.lock.txt"),
                                  ("cuda_lock", CUDA_LOCK_IN_IMAGE, f"{name}.cuda.lock.txt")):
            if (mnt / inside).is_file():
                shutil.copyfile(mnt / inside, folder / dest)
                out[key] = str(folder / dest)
    finally:
        subprocess.run(["buildah", "umount", ctr], capture_output=True)
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python helm/images/local_build.py", description=__doc__.split("\n\n")[0])
    # Checked below, not with choices=: Python 3.11's argparse checks an empty or default list
    # against the choices as one value and refused a bare `make images` ("invalid choice: []").
    parser.add_argument("images", nargs="*", help=f"of {', '.join(IMAGES)} (default: all)")
    parser.add_argument("--json", type=Path, help="write what was built (image, key, cached, seconds) here")
    parser.add_argument("--force", action="store_true", help="rebuild even when the key is in the store")
    parser.add_argument("--torch-index", metavar="URL",
                        help="take torch from this index instead of the local CPU stand-in: "
                             "https://pypi.org/simple gives PyPI's CUDA build with its nvidia-* libraries "
                             "(the training image as production runs it, for its size; no GPU needed to build)")
    args = parser.parse_args(argv)
    args.images = args.images or list(IMAGES)
    if unknown := [n for n in args.images if n not in IMAGES]:
        parser.error(f"no image {', '.join(unknown)}: choose from {', '.join(IMAGES)}")
    try:
        require_tools()
        results = {"base": ensure_base()}
        if any(IMAGES[n]["base"] == "python" for n in args.images):
            results["python-base"] = ensure_python_base()
        with tempfile.TemporaryDirectory(prefix="mf-index-") as work, (
                contextlib.nullcontext(args.torch_index) if args.torch_index else torch_index(Path(work))) as index_url:
            for name in args.images:
                results[name] = build(name, index_url, force=args.force)
                if args.json:  # the SBOM and the lock beside what was built
                    results[name].update(copy_records(results[name]["image"], args.json.parent, name))
                print(f"{name}: {results[name]['image']} ({'cached' if results[name]['cached'] else 'built in %.0f s' % results[name]['seconds']})",
                      flush=True)
    except BuildError as exc:
        print(f"local_build: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
