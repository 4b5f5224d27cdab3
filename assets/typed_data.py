"""The raw_dataset and shards assets of an image folder or a text corpus (a ``DataKind``).

Same contract as the table assets in assets/pipeline.py: each writes to the run's branch,
commits its data with its validation report, records a blocking check, and stops the run with
what failed. A dataset pipeline of this kind publishes its shards to main (tagged ``<name>-d<N>``)
as soon as they pass their checks; a model pipeline publishes them with its model version. A run
whose files and preprocessing equal the newest version's reuses it (assets/reuse.py).
"""

# No ``from __future__ import annotations``: Dagster reads the ``context`` annotation as a type.
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from assets import ingest
from assets.data_key import data_key
from assets.kinds import DataKind
from assets.reuse import not_reused_line, reused_raw
from assets.source import SourceError
from assets.source_hashes import ReadSources, read_sources, record_bytes, record_path
from assets.source_place import SourcePlace, locate_sources
from core.datasets import Reuse, reusable_version
from core.spec import PipelineSpec
from ops.runs import TRANSIENT_RETRY, ensure_run_branch
from resources.platform import PlatformSettings, VersionedStoreResource
from resources.store.base import MAIN


def build_typed_data_assets(spec: PipelineSpec, kind: DataKind, keys: dict[str, dg.AssetKey], *,
                            source_commit_tag: str, checked) -> list[dg.AssetsDefinition]:
    """``checked`` is assets.pipeline's helpers: (commit_checked, gate, replace_prefix, publish, check_owner, link)."""
    if getattr(kind, "in_parts", False):  # an image folder: its raw copy and its shards made over steps
        from assets.image_ingest_steps import build_image_raw_asset
        from assets.image_shard_steps import build_image_shards_asset

        return [build_image_raw_asset(spec, kind, keys, source_commit_tag=source_commit_tag, checked=checked,
                                      located_sources=located_sources),
                build_image_shards_asset(spec, kind, keys, checked)]
    commit_checked, gate, _replace_prefix, _publish, check_owner, link = checked
    name = spec.name
    prefix = ingest.dataset_prefix(name)
    raw_store_path = prefix + "raw/" + kind.raw_name

    @dg.asset(key=keys["raw_dataset"], group_name=name, kinds={"parquet"}, retry_policy=TRANSIENT_RETRY,
              check_specs=[dg.AssetCheckSpec("raw_expectations", asset=keys["raw_dataset"], blocking=True,
                                             description=f"Checks on every file of the {spec.source.describe()}.")],
              description=f"Source files of {name} ({spec.source.describe()}), validated and committed to the run "
                          "branch.")
    def raw_dataset(context: dg.AssetExecutionContext, platform: PlatformSettings, store: VersionedStoreResource):
        s = store.get()
        s.ensure_repository()
        check_owner(s, spec)
        with tempfile.TemporaryDirectory(prefix="raw-") as tmp:
            src = located_sources(context, spec, s, platform.sources_root, Path(tmp), source_commit_tag)
            root, source_commit, key, reuse = src.root, src.source_commit, src.key, src.reuse
            if reuse.tag is not None:  # the newest version holds this very data: nothing to make
                yield from reused_raw(context, s, keys["raw_dataset"], "raw_expectations", name, reuse,
                                      raw_store_path, ensure_run_branch(s, context.run_id), source_commit)
                return
            context.log.info(not_reused_line(name, reuse, key))
            # a text corpus: by its new documents alone when it is the published one grown
            raw = kind.ingest(spec, src.files(s), root, Path(tmp) / kind.raw_name, key=key,
                              hashes=src.hashes,
                              published=published_corpus(s, name, reuse.newest_commit, raw_store_path))
            context.log.info(f"{name}: {raw.how}")
            branch = ensure_run_branch(s, context.run_id)
            if raw.report.passed:  # otherwise only the evidence stays on the run branch
                s.put_file(branch, raw_store_path, raw.path)
                s.put_object(branch, ingest.ingest_record_path(name), json.dumps(
                    raw.record or {"not_appendable": "no ingest record"}, indent=1, sort_keys=True).encode())
            s.put_object(branch, prefix + "raw/sources.json", json.dumps(raw.sources, indent=2, sort_keys=True).encode())
            if src.record:  # the store's files: the next run hashes only the ones that change
                s.put_object(branch, record_path(name), record_bytes(src.record))
        commit_id = commit_checked(context, s, branch, platform, raw.report, "raw_dataset",
                                   f"Ingest raw data of {name}", rows=str(raw.rows), source_commit=source_commit or "")
        value = {"dataset": name, "commit_id": commit_id, "path": raw_store_path, "rows": raw.rows, "branch": branch,
                 "source_commit": source_commit, "checks": raw.report.summary(), "data_key": key}
        yield dg.Output(value, data_version=dg.DataVersion(commit_id), metadata={
            "commit_id": commit_id, "rows": raw.rows, "files": len(raw.sources), "store_link": link(s, commit_id),
            **({"source_commit": source_commit} if source_commit else {})})
        yield from gate(context, raw.report, keys["raw_dataset"], "raw_expectations", commit_id, branch)

    # a text corpus: its new parts tokenized over steps (assets/text_shard_steps.py)
    from assets.text_shard_steps import build_text_shards_asset

    return [raw_dataset, build_text_shards_asset(spec, kind, keys, checked)]


def published_corpus(store, name: str, commit: str | None, raw_path: str):
    """The ingest record of the text corpus's newest version, which a grown corpus builds on
    (assets/kinds/text_append.py); None without a version whose parameters and code are the run's
    (``Reuse.newest_commit``) or whose ingest left a record."""
    from assets.kinds.text_append import PublishedCorpus
    from resources.store.base import RefNotFoundError

    if commit is None:
        return None
    try:
        record = json.loads(store.get_object(commit, ingest.ingest_record_path(name)))
    except RefNotFoundError:
        return None
    return PublishedCorpus(record=record, fetch=lambda dest: store.download(commit, raw_path, dest))


@dataclass(frozen=True)
class LocatedSources:
    """Where a run of an image folder or a text corpus reads, and whether it has anything to make."""

    place: SourcePlace
    read: ReadSources  # the files, described (the store's hashed only where new or changed)
    key: dict  # the data key (assets/data_key.py)
    reuse: Reuse  # the newest version, and whether it holds this very data

    @property
    def root(self) -> Path:
        """The folder the files are named under (the store's are downloaded there)."""
        return self.read.root

    @property
    def source_commit(self) -> str | None:
        """The store commit the files come from, None for a local folder."""
        return self.read.commit

    @property
    def described(self) -> list[dict]:
        return self.read.described

    @property
    def record(self) -> dict[str, dict]:
        """What the version records of the store's files (``raw/source_hashes.json``); empty for a local folder."""
        return self.read.record

    @property
    def hashes(self) -> dict[str, str]:
        """Each file's sha256, by name, as described (hashed once per run, or taken from the newest version)."""
        return {d["file"]: d["sha256"] for d in self.described if "sha256" in d}

    def files(self, store) -> list[Path]:
        """Every file, for a kind that reads them all: the store's downloaded now, but for those
        downloaded to be hashed."""
        return self.read.files(store)


def located_sources(context, spec: PipelineSpec, store, sources_root: Path, tmp: Path,
                    source_commit_tag: str) -> LocatedSources:
    """The source's files described, their data key, and what the newest version of the dataset
    holds: what every kind's raw asset (or its plan step) starts from.

    As for tables: the store's ``sources/`` area at the run's pinned commit when files there match,
    else the local sources folder; absolute corpus paths as they are (assets/source_place.py). The
    log names the place read. The store's files that the newest version read, unchanged, are not
    downloaded (assets/source_hashes.py): a run that reuses a version reads none of them. Symbolic
    links are listed, not followed: the kind refuses one that leads outside the root. Missing
    files are bad input: the run stops at once, not retried.
    """
    place = locate_sources(spec, store, sources_root, context.run.tags.get(source_commit_tag) or store.resolve_ref(MAIN))
    (context.log.warning if place.hidden else context.log.info)(place.describe())
    try:
        read = read_sources(spec, store, place, tmp)
    except SourceError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    if read.in_store:
        context.log.info(f"{spec.name}: {len(read.fetched)} of the store's {len(read.objects)} source file(s) "
                         "downloaded and hashed (new or changed since the newest version); the others' sha256 "
                         "taken from its record")
    key = data_key(spec, read.described)
    return LocatedSources(place, read, key, reusable_version(store, spec.name, key))
