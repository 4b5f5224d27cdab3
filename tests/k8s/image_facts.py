"""Facts of the built images for BENCHMARKS.md ("Images built here"): ``python -m tests.k8s.image_facts
[--out FILE]`` (as root, after ``make images``; reads test-artifacts/images.json).

- each image's size (buildah's figure, and the bytes of its root file system);
- the training image against the wheels it is made of: torch's wheel and its dependencies' wheels,
  and every wheel of its lock (``pip download --no-deps`` of the lock's pins for its platform);
- the import trace of a training step inside the training image: a 2-rank CPU training run as
  its pod runs it (torchrun, -m training_runtime, uid 1000) with PYTHONPROFILEIMPORTTIME, every
  module any process imported mapped to its distribution, and the installed distributions none
  imported, with what they hold on disk.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = "/mnt/training"
# Run inside the image: its distributions, the top-level modules each provides, bytes on disk.
DISTRIBUTIONS = r"""
import importlib.metadata as md, json, os
out = {}
for d in md.distributions():
    files = [f for f in (d.files or []) if not str(f).startswith("..")]
    size = 0
    for f in files:
        try:
            size += os.path.getsize(f.locate())
        except OSError:
            pass
    top = (d.read_text("top_level.txt") or "").split()
    if not top:
        top = sorted({str(f).split("/")[0].removesuffix(".py") for f in files
                      if "/" in str(f) and not str(f).split("/")[0].endswith((".dist-info", ".data"))}
                     | {str(f).removesuffix(".py") for f in files if "/" not in str(f) and str(f).endswith(".py")})
    out[d.metadata["Name"]] = {"version": d.version, "bytes": size, "top": top}
print(json.dumps(out))
"""


def _sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw).stdout


def image_size(ref: str) -> dict:
    from tests.k8s.image_root import image_root

    size = _sh(["buildah", "images", "--format", "{{.Size}}", ref]).strip()
    with image_root(ref) as root:
        du = int(_sh(["du", "-sb", "-x", str(root.mnt)]).split()[0])
    return {"image": ref, "buildah_size": size, "root_bytes": du}


# pip takes --platform literally: the older manylinux tags the image's glibc (2.36) also runs
PLATFORMS = [a for t in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_24", "manylinux_2_17", "manylinux2014",
                         "manylinux2010", "manylinux1", "linux") for a in ("--platform", f"{t}_x86_64")]


def wheels(lock_text: str, names: set[str] | None = None) -> dict[str, int]:
    """Bytes of the wheel of each pin (or of those in ``names``) for the image's platform."""
    from packaging.utils import canonicalize_name

    pins = [l.split(";")[0].strip() for l in lock_text.splitlines() if l and not l.startswith((" ", "#"))]
    if names is not None:
        pins = [p for p in pins if canonicalize_name(p.split("==")[0]) in names]
    with tempfile.TemporaryDirectory(prefix="mf-wheels-") as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", *PLATFORMS, "--dest", d, *pins],
                       check=True, capture_output=True, text=True)
        return {p.name: p.stat().st_size for p in Path(d).glob("*.whl")}


def import_trace(ref: str, tmp: Path) -> dict:
    """A training run in the image as its pod runs it, every process importing under
    PYTHONPROFILEIMPORTTIME: the distributions imported and those never imported."""
    from resources.k8s.manifests import PodSettings, build_training_job, config_json, config_path
    from resources.launch.base import GpuRequest, TrainingJob
    from tests.k8s.image_root import image_root
    from tests.k8s.local_cluster import LocalCluster
    from tests.runtime.helpers import make_config, make_dataset

    shared = tmp / "shared"
    manifest, locations = make_dataset(shared / "data", n_train=96, n_test=32, per_shard=24)
    locations = {k: v.replace(shared.as_uri(), "file://" + SHARED) for k, v in locations.items()}
    config = make_config(Path(SHARED), manifest, locations, name="trace", epochs=1)
    settings = PodSettings(namespace="model-factory", image=ref, shared_mount_path=SHARED)
    job = TrainingJob(name="trace", config=config, nproc_per_node=2,
                      gpu=GpuRequest(nodes=1, gpus_per_node=0, cpu="1", memory="2Gi"))
    path = shared / Path(config_path(job, settings)).relative_to(SHARED)
    path.parent.mkdir(parents=True)
    path.write_text(config_json(job.config))
    subprocess.run(["chown", "-R", "1000:1000", str(shared)], check=True)
    # no code-version check: what is measured is the imports, on whichever commit the image holds
    (container,) = build_training_job(job, settings, {})["spec"]["template"]["spec"]["containers"]
    env, _ = LocalCluster(tmp, image=None)._container_env(container, 0, "trace-0-abcde", "node-a")
    with image_root(ref) as root:
        root.bind(shared, SHARED)
        proc = root.run(container["command"], env={**env, "OMP_NUM_THREADS": "1", "PYTHONPROFILEIMPORTTIME": "1"},
                        user="1000:1000")
        dists = json.loads(root.run(["python", "-c", DISTRIBUTIONS], env={}).stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"the training in the image failed:\n{proc.stderr[-3000:]}")
    modules = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)", proc.stderr, flags=re.M))
    tops = {m.split(".")[0] for m in modules}
    imported = {n: d for n, d in dists.items() if tops & set(d["top"])}
    unused = {n: d for n, d in dists.items() if n not in imported}
    return {"modules_imported": len(modules),
            "imported": {n: d["version"] for n, d in sorted(imported.items())},
            "never_imported": {n: {"version": d["version"], "bytes": d["bytes"]}
                               for n, d in sorted(unused.items(), key=lambda kv: -kv[1]["bytes"])}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s.image_facts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=Path, default=REPO / "test-artifacts/images.json")
    parser.add_argument("--out", type=Path, default=REPO / "test-artifacts/image-facts.json")
    args = parser.parse_args(argv)
    built = json.loads(args.images.read_text())
    facts: dict = {"sizes": {n: image_size(built[n]["image"]) for n in ("training", "code-location") if n in built}}
    lock = (REPO / "helm/images/training.lock.txt").read_text()
    every = wheels(lock)
    torch_deps = {"torch", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
                  "fsspec", "setuptools"}  # torch's CPU wheel's Requires-Dist, with their own
    torch_only = {k: v for k, v in every.items()
                  if re.split(r"-\d", k, maxsplit=1)[0].lower().replace("_", "-") in torch_deps}
    facts["wheels"] = {"torch_and_deps_bytes": sum(torch_only.values()), "torch_and_deps": torch_only,
                       "lock_bytes": sum(every.values()), "lock_wheels": len(every)}
    with tempfile.TemporaryDirectory(prefix="mf-trace-") as tmp:
        facts["trace"] = import_trace(built["training"]["image"], Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(facts, indent=2))
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
