"""The shards asset of a table (CSV/Parquet source), its parts sharded over Dagster steps.

A table's rows, in id order, are cut into parts of about ``samples_per_shard`` rows
(assets/sharding.py ``_write_parts``). One step sharding them all would read a 2 TB raw copy in one
process, one pod, and a failure would redo all of it. So the asset is a graph (``graph_asset``) of
three ops, as an image folder's is (assets/image_shard_steps.py):

- ``plan`` reads the raw copy's id column alone (Parquet column projection, by byte range) and cuts the ids
  where ``build_shards_from_chunks`` cuts them (``plan_parts``: the same ``cut_points`` over the
  same sorted ids). A part the published version already holds is kept without a step when that
  is proven without reading its rows: the raw asset appended to the raw copy that version was
  sharded from (``raw["appended"]``, checked against that copy's ingest record), the part has
  that version's part's first id, last id and row count, and all its rows are old rows. Old rows
  are the old copy's rows, unchanged (assets/append.py), and ids are unique, so the part holds
  the very rows, and its key (a hash of the salt and the rows) is that part's key. The other
  parts go, ``source.parts_per_step`` to a group, one dynamic output each (``DynamicOut``). A
  table without an id column has ids only from its rows' content: there ``plan`` reads every
  column (the whole raw copy), as the single step did.
- ``shard_parts``, mapped over the groups, a step each (a pod each with the Kubernetes
  executor), with the transient retry policy, so a failed group is retried alone. It reads only
  the footer and the row groups of the raw copy that hold its parts' rows, by byte range from
  any store (``store.open_object``; on lakeFS, HTTP Range requests), and keeps only those rows;
  it logs the bytes it read of the raw copy's size; it shards them with the builder of the single
  step, cut at the planned parts, so each part's shards, record and key are the ones a whole
  build makes. A part whose rows prove to hash to a published part's key (an edit that changed
  nothing there) is kept then, its files not written. It stages its files on the run's branch,
  uncommitted, and reads each back to check its sha256.
- ``publish`` (after ``collect``): the manifest from the plan, the groups' records and the kept
  parts (``sharding.table_manifest``, the normalisation merged from every part's moments, as the
  single step makes it), the split-level shard suite, and one commit.

The rows a group reads: its parts' rows are runs of the ids, not of the file, so a source whose
rows come in id order (appended ids, time stamps) makes each group read a few row groups; one
whose ids are shuffled makes each group read most of them, but keep only its own rows in memory.

Dynamic outputs, not Dagster partitions or a backfill: the groups are known only once the raw
copy exists (they are the parts that changed); they are no dimension a user selects; and a
version must be one commit, which partitions (each a materialisation of its own) would not give.
"""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotations as types.
import hashlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import numpy as np

from assets import ingest, quality
from assets.kinds.image_parts import cut_points
from assets.kinds.image_store import put_shards, strip_carried
from assets.reuse import REUSED, reused_shards
from assets.shard_steps import assemble_parts, carry_raw_commit, step_groups
from assets.sharding import (
    CARRIED,
    SPLITS,
    TablePart,
    build_shards_from_chunks,
    build_target_shards_from_chunks,
    chunk_ids,
    previous_parts,
    sample_bytes,
    table_manifest,
    target_sample_bytes,
    v1_header,
    v2_header,
)
from assets.shards_output import shards_outputs, stamp_manifest
from core.datasets import DATA_KEY
from core.spec import PipelineSpec
from ops.runs import TRANSIENT_RETRY, ensure_run_branch
from resources.platform import PlatformSettings, VersionedStoreResource
from resources.store.base import MAIN, RangedObject, RefNotFoundError
from training_runtime.data.shard_format import NORMALISE_ON_READ

SHARDS_CHECK = "shard_expectations"


# ---------------------------------------------------------------- pure: the plan


def plan_parts(ids: np.ndarray, *, target: int, previous: dict | None, salt: str,
               old_rows: int) -> tuple[list[dict], np.ndarray, list[int]]:
    """(the parts in id order, the raw copy's row positions in id order, each part's stop in it).

    A part is ``{"key": its slot, "first_id", "last_id", "rows", "kept": the published part's key
    or None}``; ``ids`` are the raw copy's, in its row order. ``old_rows``: how many of the raw
    copy's first rows are, unchanged, the rows ``previous`` (the published manifest) was sharded
    from (0 when that is not proven); ``salt`` the part key's salt (``part_salt``)."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    stops = cut_points(sorted_ids, target) if len(order) else []
    same = {(p["first_id"], p["last_id"], p["rows"]): p["key"] for p in _buildable(previous, salt)} if old_rows else {}
    parts, start = [], 0
    for i, stop in enumerate(stops):
        span = (str(sorted_ids[start]), str(sorted_ids[stop - 1]), int(stop - start))
        kept = same.get(span) if int(order[start:stop].max()) < old_rows else None
        parts.append({"key": f"{i:06d}", "first_id": span[0], "last_id": span[1], "rows": span[2], "kept": kept})
        start = stop
    return parts, order, stops


def _buildable(previous: dict | None, salt: str) -> list[dict]:
    """The published parts a new version may keep: none when the manifest has no parts that
    normalise on read, or when its parts' keys were salted otherwise (other parameters or code)."""
    if not previous or not previous.get(NORMALISE_ON_READ) or part_salt(previous.get(DATA_KEY)) != salt:
        return []
    return previous.get("parts", [])


def part_salt(key: dict | None) -> str:
    """What a table part's key is salted with: the data key's parameters and code (not its sources,
    whose change is what parts absorb), so any change of how rows become shards makes every part new."""
    return f"{key.get('parameters', '')}:{key.get('code', '')}" if key else ""


def group_rows(order: np.ndarray, stops: list[int], parts: list[dict], group: list[dict]) -> tuple[np.ndarray, list[int]]:
    """(the raw copy's positions of the rows of ``group``'s parts, in file order; their sizes)."""
    starts = [0, *stops[:-1]]
    index = {p["key"]: i for i, p in enumerate(parts)}
    rows = [order[starts[index[p["key"]]]:stops[index[p["key"]]]] for p in group]
    return np.sort(np.concatenate(rows)), [p["rows"] for p in group]


def empty_split(parts: list[TablePart]) -> str | None:
    """The first split no part has a row of, as ``sharding.refuse_empty_split`` words it."""
    for split in SPLITS:
        if not sum(p.record["splits"][split]["num_samples"] for p in parts):
            return (f"the {split} split is empty ({sum(p.record['rows'] for p in parts)} rows in all): add data or "
                    "change the split fractions")
    return None


# ---------------------------------------------------------------- the builders, as the pipeline sets them


def shard_table(spec: PipelineSpec, chunks, out: Path, *, salt: str, previous: dict | None,
                spans: list[int] | None = None) -> dict:
    """Classification tables keep shard format v1 (old model versions read them); regression and
    multi-label tables are written in format v2 with a ``target`` column. Both in parts: those of
    ``previous`` that the rows hold unchanged are kept (assets/sharding.py). ``spans``: the rows
    are these whole parts of the table, not all of it."""
    builder, args = _builder(spec)
    return builder(chunks, out_dir=out, block_rows=spec.chunk_rows, salt=salt, previous=previous, spans=spans, **args)


def table_header(spec: PipelineSpec) -> dict:
    """The manifest's header ``shard_table`` gives for ``spec`` (``sharding.v1_header``/``v2_header``)."""
    builder, args = _builder(spec)
    header = v1_header if builder is build_shards_from_chunks else v2_header
    return header(**{k: v for k, v in args.items() if k not in ("label_column",)})


def samples_per_part(spec: PipelineSpec) -> int:
    """The rows a part holds about: a shard's samples (the target of ``cut_points``)."""
    return _builder(spec)[1]["samples_per_shard"]


def _builder(spec: PipelineSpec):
    common = dict(seed=spec.split.seed, fractions=(spec.split.train, spec.split.validation, spec.split.test),
                  feature_columns=spec.feature_columns, id_column=spec.id_column, feature_shape=spec.shape)
    if spec.task == "classification":
        return build_shards_from_chunks, dict(
            label_column=spec.label_column, class_names=spec.class_names,
            samples_per_shard=spec.split.shard_samples(sample_bytes(spec.shape)), **common)
    targets = spec.target_columns
    return build_target_shards_from_chunks, dict(
        task=spec.task, target_names=targets, target_range=spec.target_range,
        samples_per_shard=spec.split.shard_samples(target_sample_bytes(spec.shape, len(targets))), **common)


# ---------------------------------------------------------------- reading the raw copy


def bytes_read(source: RangedObject) -> str:
    """What a step read of the raw copy, for its log line."""
    return (f"{source.bytes_fetched} of the raw copy's {source.size()} byte(s) read in {source.requests} "
            "ranged request(s)")


def raw_ids(spec: PipelineSpec, source) -> np.ndarray:
    """Every row's id, in the raw copy's order: the id column alone (column projection), or, for a
    table without one, the hash of each row's content (``sharding.chunk_ids``), which needs every column.
    ``source``: the raw copy, a path or a seekable file (``store.open_object``)."""
    import pyarrow.parquet as pq

    if spec.id_column:
        # pre_buffer: each row group's id chunk in one read; only that column's bytes are fetched.
        table = pq.ParquetFile(source, pre_buffer=True).read(columns=[spec.id_column])
        return table.column(0).to_numpy(zero_copy_only=False).astype(str)
    parts = [chunk_ids(spec.task, f, t, i, id_column=None, feature_columns=spec.feature_columns,
                       target_names=spec.target_columns)
             for f, t, i in ingest.iter_raw_arrays(spec, source, spec.chunk_rows)]
    return np.concatenate(parts) if parts else np.array([], dtype=str)


class RawRows:
    """The raw copy's ``rows`` (sorted positions), iterated as ``iter_raw_arrays`` gives rows: only
    the row groups holding some of them are read (``groups`` of ``total``), one at a time, and only
    those rows kept. ``source``: the raw copy, a path or a seekable file (``store.open_object``);
    with ``pre_buffer`` each row group's column chunks come in one coalesced read, so a ranged
    file makes a request or so per row group read, plus the footer."""

    def __init__(self, spec: PipelineSpec, source, rows: np.ndarray):
        import pyarrow.parquet as pq

        self.spec, self.rows = spec, rows
        self.source = pq.ParquetFile(source, pre_buffer=True)
        self.stored = json.loads((self.source.schema_arrow.metadata or {}).get(ingest.FEATURE_COLUMNS_KEY, b"null"))
        if self.stored != list(spec.feature_columns):
            raise ValueError(f"the raw copy {getattr(source, 'name', source)} holds features {self.stored}, not the "
                             f"pipeline's {list(spec.feature_columns)[:5]}...; re-materialise the raw dataset")
        meta = self.source.metadata
        self.starts = np.concatenate([[0], np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
                                      ]).astype(np.int64)
        self.groups = np.unique(np.searchsorted(self.starts, rows, side="right") - 1)
        self.total = meta.num_row_groups

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        import pyarrow as pa

        spec, rows, starts = self.spec, self.rows, self.starts
        target_column = ingest.TARGETS if spec.task == "multilabel" else spec.label_column
        for g in self.groups:
            lo, hi = np.searchsorted(rows, [starts[g], starts[g + 1]])
            table = self.source.read_row_group(int(g)).take(pa.array(rows[lo:hi] - starts[g]))
            n = table.num_rows
            features = table.column(ingest.FEATURES).combine_chunks().flatten().to_numpy().reshape(n, len(self.stored))
            targets = ingest._batch_targets(spec, table.column(target_column).combine_chunks(), n)
            ids = (table.column(spec.id_column).combine_chunks().to_numpy(zero_copy_only=False).astype(str)
                   if spec.id_column else None)
            yield features, targets, ids


def old_rows(store, name: str, raw: dict, previous: dict | None) -> tuple[int, str]:
    """(how many first rows of the raw copy are the rows ``previous`` was sharded from, why). The
    raw asset says how many rows of which published copy it appended to (``raw["appended"]``);
    that copy must be the one ``previous`` names as its source (its ingest record's files and rows)."""
    appended = raw.get("appended")
    if not previous:
        return 0, "no published version"
    if not appended:
        return 0, "the raw copy is not the published one with rows appended"
    try:
        record = json.loads(store.get_object(previous["source_commit"], ingest.ingest_record_path(name)))
    except (KeyError, RefNotFoundError):
        return 0, "the published shards' raw copy left no ingest record"
    if record.get("rows") != appended["rows"] or record.get("files") != appended["files"]:
        return 0, "the raw copy was appended to another version than the published shards were made from"
    return int(appended["rows"]), f"its first {appended['rows']} row(s) are the published version's"


def published_shards(store, prefix: str) -> tuple[str | None, dict | None]:
    """(main's commit, the shards manifest published there) that a new version builds on, or
    (None, None) before the first version."""
    try:
        commit = store.resolve_ref(MAIN)
        return commit, json.loads(store.get_object(commit, prefix + "manifest.json"))
    except RefNotFoundError:
        return None, None


def check_shards(context, spec: PipelineSpec, store, branch: str, prefix: str, manifest: dict) -> quality.QualityReport:
    """The shard suite on what the branch holds now: the shard files this version wrote, read back,
    and the kept ones by their parts' summaries where the suite allows (assets/quality/tables.py
    ``shard_tables``); ``manifest`` still marks which are kept."""
    suite = spec.expectations.shards(spec)
    read = quality.shard_tables(store, branch, prefix, manifest, suite)
    context.log.info(f"{spec.name}: shard checks on {read.read} shard file(s) read back"
                     + (f" and {read.summarised} kept one(s) counted by their parts' summaries" if read.summarised
                        else "") + (f"; kept shards read back too: {read.why_read_kept}" if read.why_read_kept else ""))
    report = quality.run_suite(f"{spec.name}/shards", suite, read.tables)
    for failure in [*read.failures, quality.untrained_labels(read.tables)]:
        report = report.with_failure(failure)
    return report


def _staged_problems(store, branch: str, prefix: str, entries: list[dict]) -> list[str]:
    """The staged files that do not read back from the branch as written (size and sha256)."""
    problems = []
    for e in entries:
        data = store.get_object(branch, prefix + e["path"])
        if len(data) != e["num_bytes"] or hashlib.sha256(data).hexdigest() != e["sha256"]:
            problems.append(f"shard {e['path']} reads back from {branch} as {len(data)} byte(s) with another sha256 "
                            f"than the {e['num_bytes']} written: the store changed it; re-execute the run")
    return problems


# ---------------------------------------------------------------- the asset


def build_table_shards_asset(spec: PipelineSpec, keys: dict[str, dg.AssetKey], checked) -> dg.AssetsDefinition:
    """The graph asset above; ``checked`` is assets.pipeline's commit, gate and publish helpers."""
    name = spec.name
    prefix = ingest.dataset_prefix(name) + "shards/"
    key = keys["shards"]
    op_name = key.to_python_identifier()
    per_step = spec.source.parts_per_step
    check_spec = dg.AssetCheckSpec(SHARDS_CHECK, asset=key, blocking=True,
                                   description="Great Expectations suite on the shards read back from the store.")

    @dg.op(name=f"{op_name}_plan", out={"groups": dg.DynamicOut(), "planned": dg.Out()}, retry_policy=TRANSIENT_RETRY)
    def plan(context, raw: dict, store: VersionedStoreResource):
        if raw.get(REUSED):
            yield dg.Output(None, "planned")
            return
        s = store.get()
        previous_commit, previous = published_shards(s, prefix)
        salt = part_salt(raw.get("data_key"))
        with s.open_object(raw["commit_id"], ingest.raw_path(name)) as source:
            ids = raw_ids(spec, source)
        how = bytes_read(source)
        old, why = old_rows(s, name, raw, previous)
        parts, order, stops = plan_parts(ids, target=samples_per_part(spec), previous=previous, salt=salt, old_rows=old)
        groups = step_groups(parts, {p["key"] for p in parts if p["kept"]}, per_step)
        context.log.info(f"{name}: {len(ids)} row(s) in {len(parts)} part(s), planned from the raw copy's "
                         f"{'id column' if spec.id_column else 'every column (no id column)'} ({how}); "
                         f"{len(parts) - sum(map(len, groups))} kept unread ({why}), {sum(map(len, groups))} to shard "
                         f"in {len(groups)} step(s) of up to {per_step}")
        yield dg.Output({"parts": parts, "previous_commit": previous_commit, "salt": salt}, "planned")
        for i, group in enumerate(groups):
            rows, spans = group_rows(order, stops, parts, group)
            yield dg.DynamicOutput({"index": i, "raw_commit": raw["commit_id"], "previous_commit": previous_commit,
                                    "salt": salt, "slots": [p["key"] for p in group], "spans": spans, "rows": rows,
                                    "first_id": group[0]["first_id"]},
                                   mapping_key=f"parts_{i:05d}", output_name="groups")

    @dg.op(name=f"{op_name}_shard_parts", retry_policy=TRANSIENT_RETRY)
    def shard_parts(context, group: dict, store: VersionedStoreResource) -> dict:
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        previous = (json.loads(s.get_object(group["previous_commit"], prefix + "manifest.json"))
                    if group["previous_commit"] else None)
        with tempfile.TemporaryDirectory(prefix="shard-parts-") as tmp:
            out = Path(tmp) / "shards"
            with s.open_object(group["raw_commit"], ingest.raw_path(name)) as source:
                try:
                    rows = RawRows(spec, source, group["rows"])
                    made = shard_rows(spec, rows, out, salt=group["salt"], previous=previous, spans=group["spans"])
                except ValueError as exc:
                    raise dg.Failure(description=f"pipeline {name!r}: cannot shard the raw data: {exc}",
                                     allow_retries=False) from exc
            how = bytes_read(source)
            written = [e for info in made["splits"].values() for e in info["shards"] if not e.get(CARRIED)]
            for entry in written:  # staged, not committed: publish commits the version
                s.put_file(branch, prefix + entry["path"], out / entry["path"])
        failures = _staged_problems(s, branch, prefix, written)
        kept = sum(all(e.get(CARRIED) for es in entries.values() for e in es) for entries in _entries(made))
        context.log.info(f"{name}: {len(group['spans'])} part(s) from id {group['first_id']!r}: {len(group['rows'])} "
                         f"row(s) read from {len(rows.groups)} of the raw copy's {rows.total} row group(s) ({how}), "
                         f"{len(written)} shard file(s) staged on {branch}"
                         + (f", {kept} part(s) found unchanged and kept" if kept else "")
                         + (f"; {len(failures)} file problem(s)" if failures else ""))
        return {"index": group["index"], "branch": branch, "prefix": prefix, "failures": failures,
                "slots": group["slots"], "records": made["parts"], "entries": _entries(made)}

    @dg.op(name=f"{op_name}_publish", retry_policy=TRANSIENT_RETRY,
           out={"result": dg.Out(), check_spec.get_python_identifier(): dg.Out(is_required=False)})
    def publish(context, raw: dict, planned, made: list, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        if raw.get(REUSED):
            yield from reused_shards(context, s, key, SHARDS_CHECK, name, raw[REUSED])
            return
        branch = ensure_run_branch(s, context.run_id)
        previous = (json.loads(s.get_object(planned["previous_commit"], prefix + "manifest.json"))
                    if planned["previous_commit"] else None)
        published = previous_parts(previous)
        kept = {p["key"]: (published[p["kept"]].record, published[p["kept"]].entries)
                for p in planned["parts"] if p["kept"]}
        ordered, failures, staged = assemble_parts([p["key"] for p in planned["parts"]],
                                                   sorted(made, key=lambda g: g["index"]), kept)
        parts = [TablePart(record, entries) for record, entries in ordered]
        if (empty := empty_split(parts)) is not None:
            raise dg.Failure(description=f"pipeline {name!r}: cannot shard the raw data: {empty}", allow_retries=False)
        manifest = table_manifest(table_header(spec), parts)
        stamp_manifest(spec, manifest, raw)
        with tempfile.TemporaryDirectory(prefix="shards-") as tmp:  # every file is staged or kept: none to upload
            moved = put_shards(s, branch, prefix, Path(tmp), manifest, planned["previous_commit"], staged)
            carry_raw_commit(context, s, raw, branch)
        carried = sum(all(e.get(CARRIED) for es in p.entries.values() for e in es) for p in parts)
        context.log.info(f"{name}: {len(parts) - carried} of {len(parts)} part(s) sharded in {len(made)} step(s)"
                         + (f", the other {carried} kept from the published version" if previous else "")
                         + f"; {moved['kept']} shard file(s) kept, {moved['copied']} copied from an earlier attempt "
                         f"or version, {moved['removed']} removed; one commit")
        report = check_shards(context, spec, s, branch, prefix, manifest)
        for failure in failures:
            report = report.with_failure(failure)
        yield from shards_outputs(context, s, spec, key, raw, strip_carried(manifest), report, branch, platform,
                                  checked)

    @dg.graph_asset(key=key, group_name=name, ins={"raw": dg.AssetIn(keys["raw_dataset"])}, kinds={"numpy"},
                    check_specs=[check_spec],
                    description=f"Seeded train/validation/test split of {name} as checksummed binary shards; its "
                                "changed parts sharded over steps.")
    def shards(raw):
        groups, planned = plan(raw)
        made = groups.map(shard_parts).collect()
        return publish(raw, planned, made)

    return shards


def shard_rows(spec: PipelineSpec, chunks, out: Path, *, salt: str, previous: dict | None, spans: list[int]) -> dict:
    """One group's parts sharded (``shard_table`` cut at ``spans``); a function of its own so a
    test can make one group fail."""
    return shard_table(spec, chunks, out, salt=salt, previous=previous, spans=spans)


def _entries(manifest: dict) -> list[dict[str, list[dict]]]:
    """Each part's shard entries per split, in the order of ``manifest["parts"]``."""
    by_path = {e["path"]: e for info in manifest["splits"].values() for e in info["shards"]}
    return [{s: [by_path[p] for p in r["splits"][s]["shards"]] for s in r["splits"]} for r in manifest["parts"]]
