"""``sources add`` (commit source files to the store's sources area) and ``sources examples`` (write
the example data the platform's own pipelines read)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.cli.errors import UsageError
from pipelines.cli.lookup import find_pipeline, workspace_of
from pipelines.profiles import Profile


def sources_add_command(args: argparse.Namespace) -> int:
    from pipelines.sources import SourceUploadError, add_source_files, hidden_local_files, plan_uploads

    found = find_pipeline(args.dataset, workspace_of(args), args.location)
    try:
        uploads = plan_uploads(found.spec, [Path(f) for f in args.files], to=args.to)
    except SourceUploadError as exc:
        raise UsageError(str(exc)) from exc
    profile = Profile.from_environment()
    store = profile.store()
    store.ensure_repository()
    sources_root = profile.resources()["platform"].sources_root
    hidden = hidden_local_files(store, found.spec, uploads, sources_root)
    if hidden:
        raise UsageError(one_place_refusal(found.spec, args, hidden, sources_root))
    try:
        done = add_source_files(store, found.spec, uploads, {"added_with": "python -m pipelines sources add"})
    except SourceUploadError as exc:
        raise UsageError(str(exc)) from exc
    for upload in uploads:
        print(f"{upload.local} -> {upload.target}")
    described = store.describe()
    print(f"Committed {len(done.paths)} file(s) to main of the {described.get('backend')} store (commit "
          f"{done.commit_id[:12]}, main now {done.main_commit_id[:12]}). The next run of {args.dataset}_training "
          f"reads them; {args.dataset}_new_data_sensor, when running, starts one.")
    return 0


def one_place_refusal(spec, args: argparse.Namespace, hidden: list[Path], sources_root: Path) -> str:
    """Why an add that would hide the local folder's files is refused, and the command that moves
    them over with it."""
    from pipelines.sources import local_source_folders

    folders = local_source_folders(spec, sources_root)
    given = " ".join(str(f) for f in args.files) + (f" --to {args.to}" if args.to else "")
    move = (f"python -m pipelines sources add {spec.name} {' '.join(map(str, folders))}" if args.to
            else f"python -m pipelines sources add {spec.name} {' '.join(map(str, folders))} {given}")
    return (f"pipeline {spec.name!r} reads its {len(hidden)} source file(s) from the local sources folder "
            f"({', '.join(map(str, folders))}), and the store's sources/ area holds none of them. Once these files "
            "are committed there, its runs read only the store's files, not the folder: one dataset reads one place "
            f"of sources. Move the folder over with them in one commit: `{move}`"
            + (f" (then `python -m pipelines sources add {spec.name} {given}`)" if args.to else ""))


def write_example_sources(root: Path) -> list[Path]:
    """The data of the platform's example pipelines that read files (digits CSV, shapes images,
    pydoc text) under ``root``; existing files are kept."""
    from pipelines.models.digits import write_digits_source
    from pipelines.models.pydoc_corpus import write_pydoc_source
    from pipelines.models.shapes import write_shapes_source

    return [write(root) for write in (write_digits_source, write_shapes_source, write_pydoc_source)]


def sources_examples_command(args: argparse.Namespace) -> int:
    root = Profile.from_environment().data_root / "sources"
    for path in write_example_sources(root):
        print(path)
    print(f"The example pipelines' sources are under {root} (digits, shapes and pydoc read them; wine and "
          "diabetes load scikit-learn's bundled data).")
    return 0
