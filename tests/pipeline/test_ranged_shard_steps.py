"""A table's and a text corpus's shard steps on lakeFS (the lakeFS-API test server over HTTP) read
only the raw copy's footer and their row groups, by HTTP Range (issue 41), and still publish the
version a single-step build makes, byte for byte.

The server counts the raw copy's bytes it sends; each step logs the bytes it read. The sharding
runs apart from the ingest (a run of the raw asset first), so what the server sent while sharding
is the plan's reads and the steps' reads (publish has the store copy the raw commit onto its
branch, assets/shard_steps.py ``carry_raw_commit``, which sends no byte): the logs cannot
under-report.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets import ingest
from assets.pipeline import build_pipeline_assets
from core.spec import Source
from resources.platform import ArtifactStoreResource, PlatformSettings, TrainingLauncherResource, VersionedStoreResource
from tests.data import test_text_steps as text_steps
from tests.pipeline import test_table_shard_steps as table_steps
from tests.pipeline.conftest import failure_messages
from tests.support.lakefs_server import LakeFSTestServer

pytestmark = pytest.mark.slow

FOOTER_READ = 64 << 10  # pyarrow's first read of a Parquet file: its last 64 KiB, for the footer
STEP_READ = re.compile(r"\((\d+) of the raw copy's (\d+) byte\(s\) read in (\d+) ranged request\(s\)\)")


@pytest.fixture
def server(tmp_path: Path):
    with LakeFSTestServer(tmp_path / "lakefs") as server:
        yield server


def _run(server: LakeFSTestServer, root: Path, spec, stages: list[str]) -> tuple[dg.ExecuteInProcessResult, list[str]]:
    """Run ``stages`` of ``spec``'s data assets with the store on the lakeFS test server; (result, logs)."""
    store = VersionedStoreResource(kind="lakefs", repository="ranged", lakefs_endpoint=server.endpoint,
                                   lakefs_access_key_id=server.access_key_id,
                                   lakefs_secret_access_key=server.secret_access_key,
                                   lakefs_storage_namespace="local://ranged")
    defs = dg.Definitions(
        assets=build_pipeline_assets(spec),
        jobs=[dg.define_asset_job("data", selection=[dg.AssetKey([spec.name, s]) for s in stages])],
        resources={"platform": PlatformSettings(data_root=str(root)), "store": store,
                   "artifacts": ArtifactStoreResource(kind="local", local_root=str(root / "artifacts")),
                   "launcher": TrainingLauncherResource(kind="local", work_root=str(root / "launches"))},
        executor=dg.in_process_executor,
    )
    (root / "home").mkdir(parents=True, exist_ok=True)
    with dg.DagsterInstance.local_temp(str(root / "home")) as instance:
        result = defs.resolve_job_def("data").execute_in_process(instance=instance, raise_on_error=False)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    return result, logs


def _sharded_on_lakefs(server: LakeFSTestServer, root: Path, spec, raw_path: str):
    """(the run, its logs, the raw copy's bytes the server sent while sharding, the raw copy's size)."""
    result, logs = _run(server, root, spec, ["raw_dataset"])
    assert result.success, failure_messages(result)
    before = server.served(raw_path)
    result, logs = _run(server, root, spec, ["shards"])
    assert result.success, failure_messages(result)
    return result, logs, server.served(raw_path) - before, VersionedStoreResource(
        kind="lakefs", repository="ranged", lakefs_endpoint=server.endpoint, lakefs_access_key_id=server.access_key_id,
        lakefs_secret_access_key=server.secret_access_key).get()


def test_table_steps_on_lakefs_read_only_the_footer_and_their_row_groups(server, tmp_path):
    root = tmp_path / "platform"
    table_steps._write(root / "sources", "ledger/table.csv", table_steps._frame(range(ROWS)))  # rows in id order
    spec = _table_spec()
    raw_path = ingest.raw_path("ledger")
    result, logs, served, store = _sharded_on_lakefs(server, root, spec, raw_path)

    manifest = table_steps._published_equals_a_single_step_build(store, spec, tmp_path / "check")
    metadata = pq.ParquetFile(store.open_object("main", raw_path)).metadata
    size = store.stat_object("main", raw_path).size_bytes
    widest = max(_row_group_span(metadata, g) for g in range(metadata.num_row_groups))
    steps = []  # (row groups read, bytes read, the raw copy's size, requests), a step each
    for message in logs:
        if (groups := re.search(r"from (\d+) of the raw copy's \d+ row group", message)) and STEP_READ.search(message):
            steps.append((int(groups.group(1)), *map(int, STEP_READ.search(message).groups())))
    plan = [int(STEP_READ.search(m).group(1)) for m in logs if "planned from the raw copy" in m]
    footer = max(FOOTER_READ, metadata.serialized_size + 8)
    # parts end where ids allow (cut_points): about ROWS / PARTS rows each
    assert PARTS - 2 <= len(manifest["parts"]) <= PARTS + 2
    assert len(steps) == len(table_steps._shard_steps(result.all_events)) == -(-len(manifest["parts"]) // PER_STEP)
    assert metadata.num_row_groups >= 16 and size > 4 * footer
    for groups, read, total, _ in steps:
        assert total == size and read <= groups * widest + footer < size / 2, (groups, read, size)
    print(f"\ntable on lakeFS: raw copy {size} bytes, {metadata.num_row_groups} row groups, "
          f"{len(manifest['parts'])} parts "
          f"in {len(steps)} steps; plan read {plan[0]}; steps read {[r for _, r, _, _ in steps]} from "
          f"{[g for g, _, _, _ in steps]} row groups in {[n for _, _, _, n in steps]} requests")
    # the plan reads the id column alone, and the logs account for every byte the server sent
    assert plan[0] < size / 2 and served == plan[0] + sum(read for _, read, _, _ in steps)


ROWS, PARTS, PER_STEP = 20_000, 16, 2


def _table_spec(chunk_mb: float = 0.05):
    """A table of 20 000 rows in about 16 parts (samples_per_shard rows each), 2 to a step: about 8 steps."""
    from pipelines.api import dataset_pipeline as declare

    return declare("ledger", source=Source(paths=("ledger/table.csv",), chunk_mb=chunk_mb, parts_per_step=PER_STEP),
                   features=list(table_steps.FEATURES), label="label", classes=range(3), id_column="id",
                   split={"seed": 7, "samples_per_shard": ROWS // PARTS})


def _row_group_span(metadata, g: int) -> int:
    """The bytes from a row group's first column chunk's first page to its last chunk's end."""
    group = metadata.row_group(g)
    chunks = [group.column(c) for c in range(group.num_columns)]
    starts = [min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset) for c in chunks]
    return max(s + c.total_compressed_size for s, c in zip(starts, chunks)) - min(starts)


def test_text_steps_on_lakefs_read_only_their_row_groups(server, tmp_path):
    """The bound is looser than the table's: a text step's row groups are not in its log line."""
    root = tmp_path / "platform"
    text_steps._write_corpus(root / "sources", range(6000))  # about 16 parts, 2 to a step, 30 row groups
    spec = text_steps._spec(parts_per_step=2, part_documents=400, docs_per_chunk=200)
    raw_path = "datasets/toy/raw/documents.parquet"
    result, logs, served, store = _sharded_on_lakefs(server, root, spec, raw_path)

    text_steps._published_equals_a_single_step_build(store, spec, tmp_path / "check")
    size = store.stat_object("main", raw_path).size_bytes
    reads = [tuple(map(int, STEP_READ.search(m).groups())) for m in logs if "part(s) tokenized" in m]
    assert len(reads) == len(text_steps._shard_steps(result.all_events)) >= 4
    assert pq.ParquetFile(store.open_object("main", raw_path)).metadata.num_row_groups >= 20
    assert size > 3 * FOOTER_READ  # so reading all of it would fail the bound below
    for read, total, _ in reads:  # beyond pyarrow's footer read, a step reads well under half the copy
        assert total == size and read - FOOTER_READ < (size - FOOTER_READ) / 2, (read, size)
    # and the steps together about the copy once (neighbouring groups share a row group at their seam)
    assert sum(read for read, _, _ in reads) - len(reads) * FOOTER_READ < 1.5 * (size - FOOTER_READ)
    # the measurement (pytest -s): what each step read against the raw copy's size
    plan = [int(STEP_READ.search(m).group(1)) for m in logs if "planned from the raw copy" in m]
    print(f"\ntext on lakeFS: raw copy {size} bytes in {len(reads)} steps; plan read {plan}; steps read "
          f"{[r for r, _, _ in reads]} in {[n for _, _, n in reads]} requests")
    # the plan reads the ids and text hashes, never a text (the byte tokenizer trains nothing):
    # at most the footer's read and those columns' chunks (this corpus' texts are a few words, so
    # the hashes are no smaller than the texts here; a text's share grows with its length)
    metadata = pq.ParquetFile(store.open_object("main", raw_path)).metadata
    columns = [metadata.row_group(g).column(c) for g in range(metadata.num_row_groups)
               for c in range(metadata.num_columns)]
    wanted = sum(c.total_compressed_size for c in columns if c.path_in_schema in ("id", "text_sha256"))
    texts = sum(c.total_compressed_size for c in columns if c.path_in_schema == "text")
    assert len(plan) == 1 and plan[0] <= FOOTER_READ + wanted and texts > FOOTER_READ, (plan, wanted, texts)
    assert served == plan[0] + sum(read for read, _, _ in reads)
