"""An image folder in the store's ``sources/`` area on lakeFS (the lakeFS-API test server over
HTTP): the raw asset's plan step takes the sha256 of every file the newest version already read
from that version's record (assets/source_hashes.py) and downloads only the new or changed files,
and the version it makes is the one a run without the record makes, byte for byte, under the
same data key.

The server counts the object bytes it sends by path; the plan step's share is what it sent of
``sources/`` from the run's start until the plan had cut its parts (the groups that decode run
after it, in process). ``python -m tests.data.test_image_plan_on_lakefs 2000`` measures a folder
of 2 000 JPEGs edited by 1 %, with and without the record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.kinds.images import ImageKind
from assets.pipeline import build_pipeline_assets
from core.spec import ImageFolder, PipelineSpec
from pipelines.models.shapes import CLASSES, draw_shape, shapes_dataset, write_shapes_source
from pipelines.sources import add_source_files, plan_uploads
from resources.platform import ArtifactStoreResource, PlatformSettings, TrainingLauncherResource, VersionedStoreResource
from tests.data.test_images import encode, write_files
from tests.pipeline.conftest import failure_messages
from tests.support.lakefs_server import LakeFSTestServer

RAW = "datasets/shapes/raw/"
SOURCES = "sources/"


def image_spec(files_per_part: int = 8, parts_per_step: int = 4) -> PipelineSpec:
    return dataclasses.replace(shapes_dataset, source=ImageFolder(
        root="shapes", files_per_part=files_per_part, parts_per_step=parts_per_step),
        split=dataclasses.replace(shapes_dataset.split, samples_per_shard=64))


@dataclasses.dataclass
class PlanRead:
    """What one run's plan step read of ``sources/``: bytes sent by the server, and its seconds."""

    bytes: int = 0
    files: int = 0
    seconds: float = 0.0


class LakeFSPlatform:
    """A data root and a store on the lakeFS test server; runs a pipeline's data assets."""

    def __init__(self, server: LakeFSTestServer, root: Path, repository: str = "plan"):
        self.server, self.root = server, root
        self.resource = VersionedStoreResource(
            kind="lakefs", repository=repository, lakefs_endpoint=server.endpoint,
            lakefs_access_key_id=server.access_key_id, lakefs_secret_access_key=server.secret_access_key,
            lakefs_storage_namespace=f"local://{repository}")
        (root / "home").mkdir(parents=True, exist_ok=True)

    def store(self):
        return self.resource.get()

    def sources_sent(self) -> dict[str, int]:
        """The bytes of each object of ``sources/`` the server sent so far."""
        with self.server._served_lock:
            return {p: n for p, n in self.server.bytes_served.items() if p.startswith(SOURCES)}

    def upload(self, spec: PipelineSpec, folder: Path, only: list[Path] | None = None) -> None:
        """Commit ``folder``'s files (or ``only`` those of them) to the store's sources area."""
        uploads = plan_uploads(spec, [folder])
        if only is not None:
            uploads = [u for u in uploads if u.local in set(only)]
        add_source_files(self.store(), spec, uploads)

    def run(self, spec: PipelineSpec, stages=("raw_dataset", "shards")) -> tuple[dg.ExecuteInProcessResult, PlanRead]:
        """Run ``stages`` in process; what the plan step read of the sources (by the time it had
        planned its parts, before any group ran) and how long the step took."""
        defs = dg.Definitions(
            assets=build_pipeline_assets(spec),
            jobs=[dg.define_asset_job("data", selection=[dg.AssetKey([spec.name, s]) for s in stages])],
            resources={"platform": PlatformSettings(data_root=str(self.root)), "store": self.resource,
                       "artifacts": ArtifactStoreResource(kind="local", local_root=str(self.root / "artifacts")),
                       "launcher": TrainingLauncherResource(kind="local", work_root=str(self.root / "launches"))},
            executor=dg.in_process_executor)
        read = PlanRead()
        before = self.sources_sent()
        with _after_plan(lambda: self._took(read, before)):
            with dg.DagsterInstance.local_temp(str(self.root / "home")) as instance:
                result = defs.resolve_job_def("data").execute_in_process(instance=instance, raise_on_error=False)
                read.seconds = _step_seconds(instance, result.run_id, "raw_dataset_plan")
        return result, read

    def _took(self, read: PlanRead, before: dict[str, int]) -> None:
        sent = {p: n - before.get(p, 0) for p, n in self.sources_sent().items() if n > before.get(p, 0)}
        read.bytes, read.files = sum(sent.values()), len(sent)


@contextlib.contextmanager
def _after_plan(callback):
    """Call ``callback`` as the image plan returns (its parts cut; no group has run yet)."""
    plan = ImageKind.plan_ingest

    def observed(self, *args, **kwargs):
        made = plan(self, *args, **kwargs)
        callback()
        return made

    ImageKind.plan_ingest = observed
    try:
        yield
    finally:
        ImageKind.plan_ingest = plan


def _step_seconds(instance, run_id: str, suffix: str) -> float:
    """Seconds from the start to the end of the run's step whose key ends with ``suffix``."""
    times = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is not None and event.step_key and event.step_key.endswith(suffix) and event.event_type_value in (
                "STEP_START", "STEP_SUCCESS"):
            times[event.event_type_value] = entry.timestamp
    return times["STEP_SUCCESS"] - times["STEP_START"] if len(times) == 2 else float("nan")


def edit(folder: Path, added: int, seed: int = 9) -> list[Path]:
    """``added`` new JPEGs spread over the classes and one existing JPEG redrawn: the files changed."""
    rng = np.random.default_rng(seed)
    new = write_files(folder, {f"{CLASSES[i % len(CLASSES)]}/new-{i:04d}.jpg": encode(
        draw_shape(CLASSES[i % len(CLASSES)], rng, 96), "JPEG") for i in range(added)})
    changed = sorted(folder.glob("circle/circle-*.jpg"))[5]
    changed.write_bytes(encode(draw_shape("circle", rng, 96), "JPEG"))
    return sorted({*(p for p in new if p.name.startswith("new-")), changed})


@pytest.fixture
def server(tmp_path: Path):
    with LakeFSTestServer(tmp_path / "lakefs") as server:
        yield server


def test_an_edited_store_folders_plan_downloads_only_the_new_and_changed_images_and_makes_the_uncached_version(
        server, tmp_path):
    from assets.data_key import data_key
    from assets.kinds.image_ingest import ingest_images
    from assets.kinds.image_store import previous_parts
    from assets.source_hashes import record_path
    from assets.source_place import describe_files

    lake = LakeFSPlatform(server, tmp_path / "platform")
    store = lake.store()
    store.ensure_repository()
    given = tmp_path / "given"
    folder = write_shapes_source(given, per_class=16, seed=3)
    spec = image_spec()
    lake.upload(spec, folder)
    first, read = lake.run(spec)
    assert first.success, failure_messages(first)
    assert read.files == 48  # no version yet: every image downloaded to hash it
    v1 = store.list_tags()["shapes-d1"]
    assert len(json.loads(store.get_object(v1, record_path("shapes")))["files"]) == 48

    changed = edit(folder, 4)
    lake.upload(spec, folder, only=changed)
    second, read = lake.run(spec)
    assert second.success, failure_messages(second)
    # the plan read the new and changed images and nothing else of the folder
    assert (read.files, read.bytes) == (5, sum(p.stat().st_size for p in changed))

    # the version is the one a read of every file makes: the same key, and the raw copy one
    # process makes of the same folder on the same previous version, byte for byte
    local = sorted(p for p in folder.rglob("*") if p.is_file())
    key = data_key(spec, describe_files(local, given))
    manifest = json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))
    assert manifest["data_key"] == key
    one = ingest_images(spec, local, given, tmp_path / "one", salt=key["parameters"] + key["code"],
                        previous=previous_parts(store, v1, RAW, tmp_path / "previous"))
    on_main = {o.path: store.get_object("main", o.path) for o in store.list_objects("main", prefix=RAW)}
    assert on_main[RAW + "parts.json"] == (one.path / "parts.json").read_bytes()
    made = {p.relative_to(one.path).as_posix(): p.read_bytes() for p in one.path.rglob("*.parquet")}
    assert made and all(on_main[RAW + rel] == content for rel, content in made.items())
    assert on_main[RAW + "sources.json"] == json.dumps(one.sources, indent=2, sort_keys=True).encode()
    assert store.get_object("main", "datasets/shapes/validation/raw_dataset.json") == one.report.to_json()
    assert 0 < one.parts["new"] < one.parts["reused"]

    # the same folder again: reused, without one image read
    before = lake.sources_sent()
    third, _ = lake.run(spec)
    assert third.success, failure_messages(third)
    assert lake.sources_sent() == before


def measure(files: int, added_share: float = 0.01) -> None:
    """A folder of ``files`` JPEGs on lakeFS, published, then edited by ``added_share``: the plan
    step's reads on the edit run."""
    with tempfile.TemporaryDirectory(prefix="plan-bench-") as tmp, LakeFSTestServer(Path(tmp) / "lakefs") as server:
        lake = LakeFSPlatform(server, Path(tmp) / "platform")
        folder = write_shapes_source(Path(tmp) / "given", per_class=files // len(CLASSES), seed=3)
        spec = image_spec(files_per_part=64, parts_per_step=8)
        lake.store().ensure_repository()
        lake.upload(spec, folder)
        first, read = lake.run(spec)
        assert first.success, failure_messages(first)
        print(f"first run: plan read {read.bytes} bytes of {read.files} files in {read.seconds:.2f} s")
        changed = edit(folder, max(1, int(files * added_share)))
        lake.upload(spec, folder, only=changed)
        second, read = lake.run(spec)
        assert second.success, failure_messages(second)
        folder_bytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"edit run ({len(changed)} files new or changed of {sum(1 for _ in folder.rglob('*.jpg'))}, "
              f"{folder_bytes} bytes): plan read {read.bytes} bytes of {read.files} files in {read.seconds:.2f} s")


if __name__ == "__main__":
    measure(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
