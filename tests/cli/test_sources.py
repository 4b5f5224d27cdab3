"""``python -m pipelines sources add``: files committed to main under the store's ``sources/`` area,
where the pipeline reads them, on the local store and on lakeFS (the lakeFS-API test server of
tests/store), after which the pipeline's new-data sensor starts a run; and where each file goes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import dagster as dg
import pytest

from assets.pipeline import SOURCE_COMMIT_TAG
from core.spec import ImageFolder, Source, Triggers
from pipelines.definitions import build_definitions
from pipelines.models.denoising import digits_denoiser
from pipelines.models.digits import digits_frame, digits_pipeline
from pipelines.models.shapes import shapes_dataset
from pipelines.models.wine import wine_pipeline
from pipelines.profiles import Profile
from pipelines.sources import SourceUploadError, add_source_files, plan_uploads
from resources.platform import VersionedStoreResource
from resources.store.base import MAIN
from tests.store.conftest import lakefs_server  # noqa: F401 (the session's lakeFS-API test server)
from tests.support.store_backends import fresh_repository_name, make_lakefs_store

GLOBBED = dataclasses.replace(digits_pipeline, source=Source(paths=("digits/*.csv",)), triggers=Triggers(cron="0 3 * * 1"))


def write_csv(path: Path, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    digits_frame().head(rows).to_csv(path, index=False)
    return path


# --- where files go ------------------------------------------------------------------------------
def test_files_go_beside_those_a_glob_reads_and_folders_keep_their_sub_folders(tmp_path):
    a, b = write_csv(tmp_path / "a.csv", 3), write_csv(tmp_path / "b.csv", 3)
    assert [u.target for u in plan_uploads(GLOBBED, [a, b])] == ["sources/digits/a.csv", "sources/digits/b.csv"]
    images = tmp_path / "more"
    for name in ("circle/c1.png", "square/s1.png"):
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        (images / name).write_bytes(b"\x89PNG")
    assert isinstance(shapes_dataset.source, ImageFolder)
    assert [u.target for u in plan_uploads(shapes_dataset, [images])] == [
        "sources/shapes/circle/c1.png", "sources/shapes/square/s1.png"]


def test_a_file_the_pipeline_would_not_read_is_refused_with_the_way_to_place_it(tmp_path):
    new = write_csv(tmp_path / "part-2.csv", 3)
    with pytest.raises(SourceUploadError) as err:
        plan_uploads(digits_pipeline, [new])  # digits reads exactly digits/digits.csv
    assert str(err.value) == ("pipeline 'digits' reads sources/digits/digits.csv: part-2.csv would not be among them; "
                              "--to digits/digits.csv replaces the file it reads with part-2.csv, or declare a "
                              "source pattern that takes it (e.g. a folder glob)")
    (placed,) = plan_uploads(digits_pipeline, [new], to="digits/digits.csv")
    assert placed.target == "sources/digits/digits.csv"
    with pytest.raises(SourceUploadError, match="would not read sources/elsewhere/x.csv; it reads sources/digits/"):
        plan_uploads(digits_pipeline, [new], to="elsewhere/x.csv")


def test_pipelines_that_read_no_files_are_refused(tmp_path):
    new = write_csv(tmp_path / "x.csv", 3)
    with pytest.raises(SourceUploadError, match="reads loader .*load_wine_frame, not files"):
        plan_uploads(wine_pipeline, [new])
    with pytest.raises(SourceUploadError, match="trains on dataset 'digits'.*add the files to 'digits'"):
        plan_uploads(digits_denoiser, [new])


# --- committed on each backend, and the sensor fires ---------------------------------------------
@pytest.fixture(params=["local", "lakefs"])
def backend(request, tmp_path):
    """(store, the resource the sensor reads it through) on a fresh repository."""
    name = fresh_repository_name()
    if request.param == "local":
        resource = VersionedStoreResource(kind="local", local_root=str(tmp_path / "store"), repository=name)
        return resource.get(), resource
    server = request.getfixturevalue("lakefs_server")
    server.proxy.clear()
    store = make_lakefs_store(server, name)
    resource = VersionedStoreResource(kind="lakefs", repository=name, lakefs_endpoint=server.endpoint,
                                      lakefs_access_key_id=server.access_key_id,
                                      lakefs_secret_access_key=server.secret_access_key,
                                      lakefs_storage_namespace=f"local://{name}")
    return store, resource


def test_added_files_land_on_main_and_the_new_data_sensor_starts_a_run(backend, tmp_path):
    store, resource = backend
    defs = build_definitions(Profile(name="local", data_root=tmp_path / "platform"), [GLOBBED, wine_pipeline],
                             with_yaml=False)
    sensor = defs.resolve_sensor_def("digits_new_data_sensor")
    with dg.instance_for_test() as instance:
        def tick(cursor):
            with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"store": resource}) as ctx:
                return sensor.evaluate_tick(ctx)

        first = tick(None)
        assert not first.run_requests  # nothing under sources/digits/ yet
        files = [write_csv(tmp_path / "upload" / "part-1.csv", 40), write_csv(tmp_path / "upload" / "part-2.csv", 40)]
        done = add_source_files(store, GLOBBED, plan_uploads(GLOBBED, files), {"added_with": "test"})

        assert done.main_commit_id == store.resolve_ref(MAIN)
        on_main = {o.path for o in store.list_objects(MAIN, prefix="sources/")}
        assert on_main == {"sources/digits/part-1.csv", "sources/digits/part-2.csv"}
        assert store.get_object(MAIN, "sources/digits/part-1.csv") == files[0].read_bytes()
        commit = store.get_commit(done.commit_id)
        assert commit.metadata["dataset"] == "digits" and commit.metadata["added_with"] == "test"
        assert json.loads(commit.metadata["source_files"]) == sorted(on_main)
        assert [b for b in store.list_branches() if b.startswith("sources-")] == []  # the upload branch is gone

        fired = tick(first.cursor)
        (request,) = fired.run_requests
        assert request.tags[SOURCE_COMMIT_TAG] == done.main_commit_id and fired.cursor == done.main_commit_id
        assert request.run_key == f"digits:{done.main_commit_id}" and request.tags["platform/trigger"] == "new_data"
        assert sensor.job_name == "digits_training"


def test_the_cli_commits_with_to_and_names_the_run_it_starts(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    new = write_csv(tmp_path / "more-digits.csv", 30)
    assert main(["sources", "add", "digits", str(new)]) == 2  # digits reads one fixed file
    assert "--to digits/digits.csv replaces the file it reads" in capsys.readouterr().err
    assert main(["sources", "add", "digits", str(new), "--to", "digits/digits.csv"]) == 0
    out = capsys.readouterr().out
    assert f"{new} -> sources/digits/digits.csv" in out and "digits_new_data_sensor" in out
    store = Profile(name="local", data_root=tmp_path / "home" / "platform").store()
    assert store.get_object(MAIN, "sources/digits/digits.csv") == new.read_bytes()
    assert main(["sources", "add", "nosuch", str(new)]) == 2
    assert "no pipeline named 'nosuch' in code location(s) platform, vision" in capsys.readouterr().err


# --- what the pipeline would not read, and one place of sources (issue 45) ---------------------------
def write_images(folder: Path, names: list[str]) -> Path:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"\x89PNG " + name.encode())  # the add reads no pixels
    return folder


def test_a_class_folder_given_alone_is_refused_naming_its_parent(tmp_path):
    new = write_images(tmp_path / "new", ["circle/c1.png", "circle/c2.png", "square/s1.png"])
    with pytest.raises(SourceUploadError) as err:
        plan_uploads(shapes_dataset, [new / "circle"])  # was flattened into sources/shapes/c1.png, then refused by the run
    assert str(err.value) == (
        f"{new}/circle/c1.png would go to sources/shapes/c1.png, directly in the image folder shapes/, where pipeline "
        "'shapes' reads no image: it reads shapes/<class>/<file> of the classes ['circle', 'square', 'triangle']; "
        f"{new}/circle is named like class 'circle': add the folder that holds it (`python -m pipelines sources add "
        f"shapes {new}`) (and 1 more file(s) like it)")
    with pytest.raises(SourceUploadError, match="place the file with --to shapes/<class>/c1.png"):
        plan_uploads(shapes_dataset, [new / "circle" / "c1.png"])
    (placed,) = plan_uploads(shapes_dataset, [new / "circle" / "c1.png"], to="shapes/circle/c1.png")
    assert placed.target == "sources/shapes/circle/c1.png"


def test_undeclared_classes_and_other_extensions_are_refused(tmp_path):
    with pytest.raises(SourceUploadError, match="in class folder 'hexagon', which is not one of the declared classes"):
        plan_uploads(shapes_dataset, [write_images(tmp_path / "a", ["hexagon/h1.png"])])
    with pytest.raises(SourceUploadError, match=r"its extension '\.gif' is not among the image extensions"):
        plan_uploads(shapes_dataset, [write_images(tmp_path / "b", ["circle/c1.gif"])])


def test_an_add_that_would_hide_the_local_folder_is_found(tmp_path):
    from pipelines.sources import hidden_local_files

    sources = tmp_path / "sources"
    local = write_images(sources / "shapes", ["circle/a.png", "square/b.png"])
    store = VersionedStoreResource(kind="local", local_root=str(tmp_path / "store")).get()
    store.ensure_repository()
    new = plan_uploads(shapes_dataset, [write_images(tmp_path / "new", ["circle/n.png"])])
    assert hidden_local_files(store, shapes_dataset, new, sources) == [local / "circle/a.png", local / "square/b.png"]
    moved = plan_uploads(shapes_dataset, [local, tmp_path / "new"])  # the folder moved over with the new file
    assert hidden_local_files(store, shapes_dataset, moved, sources) == []
    add_source_files(store, shapes_dataset, moved)
    # once the store's area holds the dataset's files, it is their one place: nothing more is hidden
    assert hidden_local_files(store, shapes_dataset, new, sources) == []


def test_the_cli_refuses_to_hide_the_local_folder_and_says_how_to_move_it(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    local = write_images(tmp_path / "home" / "platform" / "sources" / "shapes", ["circle/a.png", "square/b.png"])
    new = write_images(tmp_path / "new5", ["circle/n1.png", "triangle/n2.png"])
    assert main(["sources", "add", "shapes", str(new)]) == 2
    err = capsys.readouterr().err
    move = f"python -m pipelines sources add shapes {local} {new}"
    assert err.strip() == (
        f"error: pipeline 'shapes' reads its 2 source file(s) from the local sources folder ({local}), and the "
        "store's sources/ area holds none of them. Once these files are committed there, its runs read only the "
        "store's files, not the folder: one dataset reads one place of sources. Move the folder over with them in "
        f"one commit: `{move}`")
    store = Profile(name="local", data_root=tmp_path / "home" / "platform").store()
    assert not store.list_objects(MAIN, prefix="sources/")  # nothing was committed
    assert main(move.split()[3:]) == 0
    assert {o.path for o in store.list_objects(MAIN, prefix="sources/")} == {
        "sources/shapes/circle/a.png", "sources/shapes/square/b.png", "sources/shapes/circle/n1.png",
        "sources/shapes/triangle/n2.png"}
    capsys.readouterr()
    assert main(["sources", "add", "shapes", str(new)]) == 2  # the same bytes again
    assert "main already holds these 2 file(s) with the same content; nothing to commit" in capsys.readouterr().err
