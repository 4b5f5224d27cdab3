"""A one-off override launched from the Launchpad, as an ML engineer would try a learning rate:
the run config is typed into the Launchpad's editor in a real headless Chromium, the editor
validates it against the training op's schema (core/overrides.py), Launch Run starts it, and the
model version's lineage in the UI shows what the run changed.

The webserver serves digits alone, trained for one epoch on one rank
(tests/ui/override_definitions.py), on a temporary instance. Screenshots go to
``test-artifacts/ui/``: ``launchpad_override_error.png`` (a wrong type flagged),
``launchpad_override.png`` (the Launchpad with the override) and ``launchpad_override_lineage.png``
(the lineage's overrides row); docs/images/ holds copies of the last two.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import dagster as dg
import pytest
from playwright.sync_api import Page, expect

from core.overrides import OVERRIDES_TAG
from core.registry import read_lineage
from pipelines.profiles import Profile
from tests.ui.browser import ARTIFACTS, home_env, write_home
from tests.ui.override_definitions import QUICK_DIGITS, QUICK_WINE
from tests.ui.webserver import running_webserver

pytestmark = pytest.mark.slow

LOCATION = "overrides"
JOB = "digits_training"
TRAINING_NODE, TRAINING_OP = "digits__checkpoint", "digits_distributed_training"
LR, SEED = 0.005, 1  # the override; the pipeline's own values differ (asserted below)
WAIT_S = 600.0  # ingest, sharding, a torchrun start and the evaluation, on two busy cores
FINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def run_config_yaml(train: str) -> str:
    """Run config as typed into the Launchpad: ``train`` is the training op's ``train`` section body."""
    return (f"ops:\n  {TRAINING_NODE}:\n    ops:\n      {TRAINING_OP}:\n        config:\n          train:\n"
            + "".join(f"            {line}\n" for line in train.splitlines()))


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return write_home(tmp_path_factory.mktemp("launchpad"), "tests.ui.override_definitions", LOCATION)


@pytest.fixture(scope="module")
def ui_url(home):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with running_webserver(home_env(home), ARTIFACTS / "launchpad_webserver.log",
                           workspace=home.parent / "workspace.yaml") as url:
        yield url


def open_launchpad(page: Page, ui_url: str) -> None:
    page.goto(f"{ui_url}/locations/{LOCATION}/jobs/{JOB}/playground")
    expect(page.locator(".CodeMirror").first).to_be_visible()


def editor_text(page: Page) -> str:
    return page.evaluate("() => document.querySelector('.CodeMirror').CodeMirror.getValue()")


def type_run_config(page: Page, text: str) -> None:
    """Replace the editor's text. ``insert_text`` enters it as one input, as a paste would: typed
    key by key, the editor's auto-indent would indent each new line a second time. The Launchpad
    fills the editor with the job's scaffold (``resources: ...``) once its config schema arrives,
    which on two busy cores can come after the editor is visible and replace what was typed (a
    clean-clone run saw that), so the text is entered again until it has stayed for a second."""
    deadline = time.monotonic() + 60
    while True:
        page.locator(".CodeMirror").first.click()
        page.keyboard.press("ControlOrMeta+a")
        page.keyboard.insert_text(text)
        page.wait_for_timeout(1000)
        if editor_text(page) == text or time.monotonic() > deadline:
            break
    assert editor_text(page) == text


def launch_button(page: Page):
    return page.get_by_role("button", name="Launch Run")


def test_the_launchpad_flags_an_override_of_the_wrong_type(page, ui_url):
    open_launchpad(page, ui_url)
    type_run_config(page, run_config_yaml(f'lr: "abc"\nseed: {SEED}'))
    path = f"root:ops:{TRAINING_NODE}:ops:{TRAINING_OP}:config:train:lr"
    expect(page.get_by_text(re.compile(rf'Invalid scalar at path {path}\. Value "abc" .*expected type "Float"'))
           ).to_be_visible()
    expect(launch_button(page)).to_be_disabled()
    page.screenshot(path=ARTIFACTS / "launchpad_override_error.png")
    # A field the recipe does not have is flagged too, naming it.
    type_run_config(page, run_config_yaml("learning_rate: 0.005"))
    expect(page.get_by_text(re.compile(r'Received unexpected config entry "learning_rate"'))).to_be_visible()
    expect(launch_button(page)).to_be_disabled()


def test_an_override_launched_from_the_launchpad_is_in_the_lineage(page, ui_url, home):
    pipeline_lr, pipeline_seed = QUICK_DIGITS.recipe.lr, QUICK_DIGITS.recipe.seed
    assert (pipeline_lr, pipeline_seed) != (LR, SEED), "the override must change the pipeline's values"

    open_launchpad(page, ui_url)
    type_run_config(page, run_config_yaml(f"lr: {LR}\nseed: {SEED}"))
    expect(launch_button(page)).to_be_enabled()  # the schema accepts it
    expect(page.get_by_text("No errors", exact=True)).to_be_visible()  # the Launchpad's error list
    # The cursor on `lr`: the editor's help lists the train section's fields, each with its
    # description and the pipeline's value (core/overrides.py overrides_config_schema).
    page.locator(".CodeMirror-line", has_text="lr:").first.click()
    lr_help = page.get_by_text(re.compile(rf"learning rate\. The pipeline says {re.escape(json.dumps(pipeline_lr))}\."))
    expect(lr_help.first).to_be_visible()
    lr_help.first.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "launchpad_override.png")
    launch_button(page).click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"))
    run_id = re.search(r"/runs/([0-9a-f-]{36})", page.url).group(1)
    page.goto("about:blank")  # the run page's live log would keep two shared cores busy while we wait

    with dg.DagsterInstance.from_config(str(home)) as instance:
        deadline = time.monotonic() + WAIT_S
        while instance.get_run_by_id(run_id).status not in FINAL and time.monotonic() < deadline:
            time.sleep(2.0)
        run = instance.get_run_by_id(run_id)
        failures = [r.event_log_entry.dagster_event.message for r in instance.get_records_for_run(run_id).records
                    if r.event_log_entry.dagster_event and r.event_log_entry.dagster_event.is_failure]
    assert run.status == dg.DagsterRunStatus.SUCCESS, f"run {run_id} ended {run.status}: {failures}"
    assert run.run_config["ops"][TRAINING_NODE]["ops"][TRAINING_OP]["config"]["train"] == {"lr": LR, "seed": SEED}
    assert run.tags[OVERRIDES_TAG] == f"train.lr={LR} train.seed={SEED}"

    record = read_lineage(Profile(name="local", data_root=home / "platform").store(), "digits")
    assert record["dagster"]["run_id"] == run_id
    assert record["overrides"] == {"train.lr": {"pipeline": pipeline_lr, "run": LR},
                                   "train.seed": {"pipeline": pipeline_seed, "run": SEED}}
    assert record["training"]["config"]["train"]["lr"] == LR  # the training itself used the override

    page.goto(f"{ui_url}/assets/digits/model_version")
    lineage_row = page.locator("tr", has=page.get_by_text("lineage", exact=True)).first
    expect(lineage_row).to_be_visible()
    show = lineage_row.get_by_text("[Show Markdown]")  # a table this long sits behind the button
    if show.count():
        show.click()
    overrides = page.locator("tr", has=page.get_by_text("overrides", exact=True)).last
    expect(overrides).to_contain_text(f"train.lr {json.dumps(pipeline_lr)} -> {json.dumps(LR)}")
    expect(overrides).to_contain_text(f"train.seed {json.dumps(pipeline_seed)} -> {json.dumps(SEED)}")
    overrides.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "launchpad_override_lineage.png")


def test_a_sweeps_trials_show_as_a_table_and_a_plot_on_the_checkpoint(page, ui_url, home):
    """A sweep run (three trials, two at a time) through the instance the webserver reads; the
    checkpoint's page lists the trials in a table and plots the objective per trial."""
    from pipelines.definitions import build_definitions, training_job_name

    profile = Profile(name="local", data_root=home / "platform")
    job = build_definitions(profile, [QUICK_WINE], with_yaml=False).resolve_job_def(training_job_name(QUICK_WINE))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    assert result.success, [e.event_specific_data.error.message for e in result.all_events if e.is_step_failure]
    sweep = read_lineage(profile.store(), "wine")["sweep"]

    page.goto(f"{ui_url}/assets/wine/checkpoint")
    trials_row = page.locator("tr", has=page.get_by_text("sweep_trials", exact=True)).first
    expect(trials_row).to_be_visible()
    trials_row.scroll_into_view_if_needed()
    # Dagster draws a table metadata value inline: a header row, then one row per trial.
    table = trials_row.locator("table")
    header = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    assert header[:3] == ["trial", "state", "value"] and {"train.lr", "model.hidden_sizes"} <= set(header)
    rows = [[c.strip() for c in row.locator("td").all_inner_texts()] for row in table.locator("tbody tr").all()]
    assert [(row[0], row[1]) for row in rows] == [(str(r["number"]), r["state"]) for r in sweep["records"]]
    page.screenshot(path=ARTIFACTS / "sweep_trials.png")
    plot = page.locator("tr", has=page.get_by_text("sweep_objective", exact=True)).first
    expect(plot).to_be_visible()
    show = plot.get_by_text("[Show Markdown]")
    if show.count():
        show.click()
    expect(page.locator("img[alt='objective per trial']").first).to_be_visible()
    page.screenshot(path=ARTIFACTS / "sweep_objective.png")
