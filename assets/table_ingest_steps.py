"""The raw_dataset asset of a table read from files, its files ingested over Dagster steps.

Parsing, checking and converting every file of a large source is one step's work when one op does
it: one pod, and one failure redoes all of it. A full ingest already parses each file on its own
(assets/source.py: no chunk spans two files, a file's types come from it alone), so the files can
be read by several steps and their results put together into exactly what one pass makes. The
asset is a graph (Dagster's ``graph_asset``) of three ops, as an image folder's is
(assets/image_ingest_steps.py):

- ``plan``: where the files lie, the data key and the reuse check (a run whose data the newest
  version holds ends here), whether the published version can be appended to (assets/append.py),
  and otherwise the files in groups of ``source.files_per_step`` in the source's order, one
  dynamic output each. The grouping only spreads the work: it is not part of the data key;
- ``ingest_files``, mapped over the groups: a step each (a pod each with the Kubernetes
  executor), with the transient retry policy, so a failed group is retried alone; bad input
  (``SourceError``) fails at once. It parses its files, runs the raw suite's per-chunk work on
  each chunk (``ChunkedRawSuite.observe``: outcomes, key columns, class counts, not yet added
  up), converts the chunks into row groups of a Parquet part that it stages on a branch beside the
  run's (``parts_branch``), never committed, and describes its files (size, sha256) for the ingest record;
- ``publish`` (after ``collect``): adds the groups' observations up in the source's order
  (``ChunkedRawSuite.take``), so every expectation, per chunk or on the whole key table, is
  judged as one pass judges it; the platform's rules across groups (the first refused chunk, no
  rows, ids unique over every row group); the parts' row groups joined as bytes into ONE raw copy
  (assets/parquet_splice.py ``join``); the ingest record and key table; ONE commit with the
  report and the blocking ``raw_expectations`` check. The staged parts never reach a commit; their
  branch is deleted once the version is committed, so a retried publish joins them again.

The result is the single step's, byte for byte: raw copy, key table, record, report, sources.json
(tests/pipeline/test_table_ingest_steps.py). A source grown by appended rows or new files is
ingested by its new rows alone, by ``publish`` itself (the plan proves the growth: its new rows
are few by nature, so it stays one step). A loader function's frame stays one step
(assets/pipeline.py).

**Readers across groups.** One pass reads every CSV file with Arrow unless Arrow falls back to
pandas on one of them; then it reads EVERY file again with pandas (assets/ingest.py), and the
record names that reader. A group cannot know that another group's file will fall back, so each
group reads with Arrow, a group that falls back reads its own files again with pandas, and
``publish``, seeing any group fall back, reads again with pandas the groups Arrow read (in its own
step: fallbacks are rare, and the plan cannot know of one without parsing every file). The
verdicts, the bytes and the record are then those of a pandas pass, as in one step.
"""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotations as types.
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import dagster as dg

from assets import append, ingest, parquet_splice
from assets.arrow_csv import ArrowFallback
from assets.data_key import data_key
from assets.ingest import Ingested, _ParquetAppender, _duplicate_ids, _fresh, chunk_shape
from assets.prefetch import prefetched
from assets.quality import QualityReport
from assets.quality.chunked import ChunkedRawSuite
from assets.reuse import not_reused_line, reused_raw
from assets.source import SourceChunks, SourceError, resolve_source_files, validated_arrays
from assets.source_place import SOURCES_PREFIX, locate_sources, table_descriptions
from core.datasets import reusable_version
from core.spec import PipelineSpec
from ops.runs import TRANSIENT_RETRY, ensure_run_branch, run_branch_name
from resources.platform import PlatformSettings, VersionedStoreResource
from resources.store.base import MAIN, RefNotFoundError

CHECK = "raw_expectations"
PARTS_SUFFIX = "-parts"  # the ingest groups' branch: the run's branch name and this


def parts_branch(store, run_id: str) -> str:
    """The branch a run's ingest groups stage their parts on: a branch of their own beside the run's
    (made from main), so the run's commit never holds them and ``publish`` can drop them only once
    the version is committed (a publish retried after a failed commit finds them still there). One
    that a failed run leaves holds no commit, so housekeeping deletes it as merged."""
    name = run_branch_name(run_id) + PARTS_SUFFIX
    store.create_branch(name, MAIN, exist_ok=True)
    return name


def drop_parts_branches(store, names: set[str]) -> None:
    """Delete the branches the groups staged on (a re-execution's groups may have staged on the
    earlier run's); one already gone was dropped by an earlier try of this publish."""
    for name in sorted(names):
        try:
            store.delete_branch(name)
        except RefNotFoundError:
            pass  # gone already: what this call is for


# ---------------------------------------------------------------- a group's files, and the groups put together


def ingest_group(spec: PipelineSpec, asset: str, suite, files: list[Path], out: Path, *, arrow: bool = True,
                 hashes: dict[str, str] | None = None) -> dict:
    """One group's files parsed, observed by the raw suite chunk by chunk and converted: what
    ``merge`` needs of them (plain data). ``out`` receives the group's row groups (none written:
    no such file). ``arrow``: False reads every file with pandas (``publish`` after a fallback
    elsewhere). ``hashes``: the files' sha256 this run already computed, by path."""
    chunks = SourceChunks(spec, files, spec.chunk_rows)
    fast = chunks.fast() if arrow else None
    if fast is not None:
        try:
            return _group(spec, asset, suite, chunks, fast, out, "arrow", hashes)
        except ArrowFallback as exc:  # as one pass does: read again, by pandas, from the first file
            out.unlink(missing_ok=True)
            return {**_group(spec, asset, _fresh(suite), chunks, iter(chunks), out, f"pandas ({exc})", hashes),
                    "fell_back": str(exc)}
    return _group(spec, asset, suite, chunks, iter(chunks), out, "pandas", hashes)


def _group(spec: PipelineSpec, asset: str, suite, chunks: SourceChunks, frames, out: Path, reader: str,
           hashes: dict[str, str] | None) -> dict:
    # the loop of assets/ingest.py ``_ingest``, but the suite only observes: publish adds up
    checker = ChunkedRawSuite(asset, suite, spec.feature_columns, spec.label_column, task=spec.task,
                              label_columns=spec.label_columns) if suite is not None else None
    writer = _ParquetAppender(out, spec)
    observed, error, rows, columns, last = [], None, 0, None, None
    try:
        for chunk in prefetched(frames):
            columns = len(chunk.columns) if columns is None else columns
            rows += len(chunk)
            last = chunk_shape(chunk)
            if checker is not None:
                observed.append(checker.observe(chunk))
            if error is None and len(chunk):
                try:
                    features, targets, ids = validated_arrays(spec, chunk)
                except SourceError as exc:
                    error = str(exc)
                    continue
                writer.append(features, targets, ids)
    finally:
        writer.close()
    fixed = chunks.fixed.get(len(chunks.files) - 1) if reader == "arrow" else None
    return {"observed": observed, "rows": rows, "columns": columns, "last": last, "error": error, "reader": reader,
            "fell_back": None, "part": out if out.exists() else None,
            "described": [append.described(f, hashes) for f in chunks.files],
            "end": append.file_end(spec, chunks.files[-1], fixed)}


def source_reader(groups: list[dict]) -> str:
    """The reader one pass over every group's files names: pandas with the first fallback's
    reason, else Arrow where it read any file, else pandas."""
    fell = next((g["fell_back"] for g in groups if g["fell_back"]), None)
    if fell is not None:
        return f"pandas ({fell})"
    return "arrow" if any(g["reader"] == "arrow" for g in groups) else "pandas"


def merge(spec: PipelineSpec, asset: str, suite, groups: list[dict], out: Path, *, key: dict | None) -> Ingested:
    """The groups (``ingest_group``'s results, in the source's order, each with its ``part`` where
    it lies here) as one pass over all their files: ``ingest.ingest_chunks``' and then
    ``append.record``'s result, the raw copy written to ``out``. The groups must agree on the
    reader (``needs_pandas``)."""
    checker = ChunkedRawSuite(asset, suite, spec.feature_columns, spec.label_column, task=spec.task,
                              label_columns=spec.label_columns) if suite is not None else None
    for group in groups:
        for seen in group["observed"] if checker is not None else ():
            checker.take(seen)
    rows = sum(g["rows"] for g in groups)
    columns = next((g["columns"] for g in groups if g["columns"] is not None), None)
    error = next((g["error"] for g in groups if g["error"]), None)  # the first chunk refused stops the writing
    if error is None and rows == 0:
        error = f"pipeline {spec.name!r}: the source has no rows (header only or empty)"
    if error is None:
        parquet_splice.join([g["part"] for g in groups if g["part"] is not None], out)
        if spec.id_column:
            error = _duplicate_ids(spec, row_group_ids(spec, out))
    report = checker.finish() if checker is not None else QualityReport(asset, [])
    done = Ingested(report=report.with_failure(error), rows=rows, columns=columns or 0, path=out,
                    reader=source_reader(groups), checker=checker, last_chunk=groups[-1]["last"] if groups else None)
    if not (done.report.passed and checker is not None):
        return done
    made, keys = append.record_of(key, [d for g in groups for d in g["described"]], groups[-1]["end"], done,
                                  out.parent / "keys.parquet")
    return replace(done, record=made, keys=keys)


def needs_pandas(groups: list[dict]) -> list[int]:
    """The groups (by position) to read again with pandas: those Arrow read, when another fell back."""
    if not any(g["fell_back"] for g in groups):
        return []
    return [i for i, g in enumerate(groups) if g["reader"] == "arrow"]


def row_group_ids(spec: PipelineSpec, path: Path) -> list:
    """The raw copy's ids, one array per row group: per chunk, as one pass keeps them for the
    unique-id rule (a chunk's own ids were checked as it was converted)."""
    import pyarrow.parquet as pq

    raw = pq.ParquetFile(path, pre_buffer=False)
    return [raw.read_row_group(i, columns=[spec.id_column]).column(0).to_numpy(zero_copy_only=False).astype(str)
            for i in range(raw.num_row_groups)]


def file_groups(entries: list, per_step: int) -> list[list]:
    """The source's files, ``per_step`` to a group, in the source's order."""
    return [entries[i:i + per_step] for i in range(0, len(entries), per_step)]


# ---------------------------------------------------------------- the store: what the raw asset puts and reads


def appended_output(ingested: Ingested, published: append.Published | None) -> dict:
    """``{"appended": the published copy's rows and files}`` when the raw copy is the published one
    with rows appended (its first rows those rows, unchanged: assets/append.py), which lets the
    shards' plan keep parts without reading them (assets/table_shard_steps.py); else nothing."""
    if published is None or ingested.appended_to is None:
        return {}
    return {"appended": {"rows": published.record["rows"], "files": published.record["files"]}}


def published_raw(store, name: str) -> append.Published | None:
    """The ingest record of the raw copy on main, which an appended source builds on; None before
    the first version."""
    try:
        record = json.loads(store.get_object(MAIN, ingest.ingest_record_path(name)))
    except RefNotFoundError:
        return None
    return append.Published(record=record, fetch=lambda path, dest: store.download(MAIN, path, dest))


def put_raw(store, branch: str, name: str, ingested: Ingested) -> None:
    """The raw copy and its ingest record; the key table beside it, or none (the run branch holds
    main's: a stale one must not outlive the raw copy it describes)."""
    store.put_file(branch, ingest.raw_path(name), ingested.path)
    record = ingested.record or {"version": append.RECORD_VERSION,
                                 "not_appendable": "no ingest record (a loader's frame, or no suite)"}
    store.put_object(branch, ingest.ingest_record_path(name), json.dumps(record, indent=1, sort_keys=True).encode())
    if ingested.keys is not None:
        store.put_file(branch, ingest.keys_path(name), ingested.keys)
    elif store.exists(branch, ingest.keys_path(name)):
        store.delete_object(branch, ingest.keys_path(name))


def source_entries(spec: PipelineSpec, place) -> list[list[str]]:
    """Each file of the source as ``[where, path]``: ``store`` and its path in the store, or
    ``local`` and where it lies; in the order of ``table_descriptions`` (and of a single step's
    files, assets/source_place.py ``table_source_files``)."""
    if not place.in_store:
        return [["local", str(p)] for p in resolve_source_files(spec, place.sources_root)]
    absolute = tuple(p for p in spec.source.paths if Path(p).is_absolute())
    local = resolve_source_files(spec, Path("/"), patterns=absolute) if absolute else []
    return [["store", o.path] for o in place.objects] + [["local", str(p)] for p in local]


def fetched(store, commit: str | None, entries: list, dest: Path) -> list[Path]:
    """The files where this step reads them: a store's downloaded from the run's source commit
    (as a single step downloads them, so their names are the same), a local one where it lies."""
    return [store.download(commit, path, dest / path) if where == "store" else Path(path) for where, path in entries]


# ---------------------------------------------------------------- the graph


def build_table_raw_asset(spec: PipelineSpec, keys: dict[str, dg.AssetKey], *, source_commit_tag: str,
                          checked) -> dg.AssetsDefinition:
    """``checked``: assets.pipeline's helpers (commit, gate, _, _, owner check, link)."""
    commit_checked, gate, _replace_prefix, _publish, check_owner, link = checked
    name = spec.name
    asset = f"{name}/raw_dataset"
    raw_prefix = ingest.dataset_prefix(name) + "raw/"
    key = keys["raw_dataset"]
    ident = key.to_python_identifier()
    check_spec = dg.AssetCheckSpec(CHECK, asset=key, blocking=True,
                                   description="Great Expectations suite on the source as parsed.")

    def failed_input(exc: SourceError) -> dg.Failure:  # bad input: a retry cannot help
        return dg.Failure(description=str(exc), allow_retries=False)

    @dg.op(name=f"{ident}_plan", retry_policy=TRANSIENT_RETRY, out={"plan": dg.Out(), "groups": dg.DynamicOut()})
    def plan(context, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        s.ensure_repository()
        check_owner(s, spec)
        place = locate_sources(spec, s, platform.sources_root,
                               context.run.tags.get(source_commit_tag) or s.resolve_ref(MAIN))
        (context.log.warning if place.hidden else context.log.info)(place.describe())
        try:
            entries, sources = source_entries(spec, place), table_descriptions(spec, place)
        except SourceError as exc:
            raise failed_input(exc) from exc
        data = data_key(spec, sources)
        reuse = reusable_version(s, name, data)
        if reuse.tag is not None:  # the newest version holds this very data: nothing to make
            yield dg.Output({"reuse": reuse, "source_commit": place.commit}, "plan")
            return
        context.log.info(not_reused_line(name, reuse, data))
        # each local file's sha256, hashed for the data key, by path: no step hashes it again
        hashes = {path: d["sha256"] for (where, path), d in zip(entries, sources) if where == "local"}
        why = _why_not_appended(spec, s, place.commit, entries, data, hashes)
        planned = {"source_commit": place.commit, "data_key": data, "sources": sources, "entries": entries,
                   "hashes": hashes, "why": why}
        groups = [] if why is None else file_groups(entries, spec.source.files_per_step)
        if why is None:
            context.log.info(f"{name}: the source grew since the published version; its new rows are ingested "
                             "alone, in the publish step")
        else:
            context.log.info(f"{name}: {len(entries)} file(s) to ingest in {len(groups)} step(s) of up to "
                             f"{spec.source.files_per_step} (every row read: {why})")
        yield dg.Output({**planned, "groups": len(groups)}, "plan")
        for i, group in enumerate(groups):
            yield dg.DynamicOutput({"index": i, "entries": group, "source_commit": place.commit,
                                    "hashes": {p: h for p, h in hashes.items() if ["local", p] in group}},
                                   mapping_key=f"files_{i:05d}", output_name="groups")

    @dg.op(name=f"{ident}_ingest_files", retry_policy=TRANSIENT_RETRY)
    def ingest_files(context, group: dict, store: VersionedStoreResource) -> dict:
        s = store.get()
        branch = parts_branch(s, context.run_id)
        with tempfile.TemporaryDirectory(prefix="ingest-files-") as tmp:
            files = fetched(s, group["source_commit"], group["entries"], Path(tmp) / "sources")
            try:
                done = ingest_group(spec, asset, spec.expectations.raw(spec), files, Path(tmp) / "part.parquet",
                                    hashes=group["hashes"])
            except SourceError as exc:
                raise failed_input(exc) from exc
            staged = None
            if done["part"] is not None:  # staged, not committed: publish joins the parts and removes them
                staged = {"branch": branch, "path": f"{raw_prefix}steps/files_{group['index']:05d}.parquet"}
                s.put_file(branch, staged["path"], done["part"])
        names = ", ".join(f.name for f in files[:3]) + (" ..." if len(files) > 3 else "")
        context.log.info(f"{name}: {len(files)} file(s) ingested ({names}): {done['rows']} row(s), "
                         f"{len(done['observed'])} chunk(s) observed by the raw suite, read by {done['reader']}"
                         + (f", row groups staged on {branch}" if staged else ", no row group written")
                         + (f"; refused: {done['error']}" if done["error"] else ""))
        return {**done, "part": staged, "index": group["index"], "entries": group["entries"],
                "source_commit": group["source_commit"], "hashes": group["hashes"]}

    @dg.op(name=f"{ident}_publish", retry_policy=TRANSIENT_RETRY,
           out={"result": dg.Out(), check_spec.get_python_identifier(): dg.Out(is_required=False)})
    def publish(context, planned: dict, made: list, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        branch = ensure_run_branch(s, context.run_id)
        source_commit = planned["source_commit"]
        if planned.get("reuse") is not None:
            yield from reused_raw(context, s, key, CHECK, name, planned["reuse"], ingest.raw_path(name), branch,
                                  source_commit)
            return
        data, suite = planned["data_key"], spec.expectations.raw(spec)
        groups = sorted(made, key=lambda g: g["index"])
        if len(groups) != planned["groups"]:
            raise RuntimeError(f"{name}: {len(groups)} of the plan's {planned['groups']} group(s) of files reached "
                               "publish (a re-execution that lost a group's output); re-execute the whole run")
        published = None
        with tempfile.TemporaryDirectory(prefix="raw-") as tmp:
            tmp = Path(tmp)
            try:
                if not groups:  # the plan proved an append: the new rows alone, here
                    published = published_raw(s, name)
                    files = fetched(s, source_commit, planned["entries"], tmp / "sources")
                    ingested = append.ingest_source(spec, asset, suite, SourceChunks(spec, files, spec.chunk_rows),
                                                    tmp / "data.parquet", key=data, published=published,
                                                    hashes=planned["hashes"])
                else:
                    ingested = _merged(context, s, spec, asset, suite, groups, tmp, key=data)
                    ingested = replace(ingested, how=f"every row read ({ingested.rows}): {planned['why']}")
            except SourceError as exc:
                raise failed_input(exc) from exc
            context.log.info(f"{name}: {ingested.how}")
            report = ingested.report
            if report.passed:  # otherwise only the evidence stays on the run branch; nothing reaches main
                put_raw(s, branch, name, ingested)
            s.put_object(branch, raw_prefix + "sources.json",
                         json.dumps(planned["sources"], indent=2, sort_keys=True).encode())
        commit_id = commit_checked(context, s, branch, platform, report, "raw_dataset", f"Ingest raw data of {name}",
                                   rows=str(ingested.rows), source_commit=source_commit or "")
        # only once the version is committed: a publish retried after a failed commit joins the parts again
        drop_parts_branches(s, {g["part"]["branch"] for g in groups if g["part"] is not None})
        value = {"dataset": name, "commit_id": commit_id, "path": ingest.raw_path(name), "rows": ingested.rows,
                 "branch": branch, "source_commit": source_commit, "checks": report.summary(), "data_key": data,
                 **appended_output(ingested, published)}
        yield dg.Output(value, output_name="result", data_version=dg.DataVersion(commit_id), metadata={
            "commit_id": commit_id, "rows": ingested.rows, "columns": ingested.columns,
            "sources": dg.MetadataValue.json(planned["sources"]), "store_link": link(s, commit_id),
            "ingest_steps": len(groups), **({"source_commit": source_commit} if source_commit else {})})
        yield from gate(context, report, key, CHECK, commit_id, branch)

    @dg.graph_asset(key=key, group_name=name, kinds={"parquet"}, check_specs=[check_spec],
                    description=f"Source data of {name}, validated and committed to the run branch; its files "
                                "ingested over steps.")
    def raw_dataset():
        planned, groups = plan()
        made = groups.map(ingest_files).collect()
        return publish(planned, made)

    return raw_dataset


def _why_not_appended(spec: PipelineSpec, store, commit: str | None, entries: list, data: dict,
                      hashes: dict[str, str]) -> str | None:
    """None when the source is the published version's grown (assets/append.py ``plan``), else why
    every row is read. The files are fetched only once the record allows an append."""
    published = published_raw(store, spec.name)
    if published is None:
        return "no published version to build on"
    why = append.premise(spec.expectations.raw(spec), data, published.record)
    if why is not None:
        return why
    with tempfile.TemporaryDirectory(prefix="raw-plan-") as tmp:
        files = fetched(store, commit, entries, Path(tmp) / "sources")
        planned = append.plan(spec, SourceChunks(spec, files, spec.chunk_rows), spec.expectations.raw(spec), data,
                              published.record, hashes=hashes)
    return planned if isinstance(planned, str) else None


def _merged(context, store, spec: PipelineSpec, asset: str, suite, groups: list[dict], tmp: Path, *,
            key: dict) -> Ingested:
    """``merge`` of the groups' results, their parts fetched from the branches they were staged
    on, the groups Arrow read read again with pandas when another fell back (the module's
    docstring)."""
    groups = [dict(g) for g in groups]
    redo = needs_pandas(groups)
    if redo:
        context.log.info(f"{spec.name}: Arrow fell back to pandas in a group ({source_reader(groups)}): "
                         f"{len(redo)} group(s) Arrow read are read again with pandas, as one pass reads every file")
    for i, group in enumerate(groups):
        if i in redo:
            files = fetched(store, group["source_commit"], group["entries"], tmp / "sources")
            again = ingest_group(spec, asset, _fresh(suite), files, tmp / f"part-{i}.parquet", arrow=False,
                                 hashes=group["hashes"])
            groups[i] = {**group, **again}
        elif group["part"] is not None:
            where = group["part"]
            if not store.exists(where["branch"], where["path"]):
                raise RuntimeError(f"{spec.name}: the row groups of the source's files {group['entries'][0][1]} ... "
                                   f"staged at {where['path']} on {where['branch']} are gone (a publish that failed "
                                   "after removing them); re-execute the whole run")
            groups[i] = {**group, "part": store.download(where["branch"], where["path"], tmp / f"part-{i}.parquet")}
    return merge(spec, asset, suite, groups, tmp / "data.parquet", key=key)
