"""What users read matches what happens: run links carry the address the web UI serves on, a gate
record holds only the bounds the pipeline set, a language model's readable lineage shows its
sampled continuations, and ``demo --help`` names the jobs the demo runs."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest

from core.lineage import lineage_markdown, lineage_rows
from core.spec import QualityGate
from pipelines.profiles import DEFAULT_UI_PORT, Profile, served_ui_url
from tests.cli.records import make_record
from tests.support.ports import free_ports
from tests.ui.webserver import _stop_group, _wait_until_serving


# --- links ---------------------------------------------------------------------------------------
def test_run_links_follow_the_webservers_own_settings_or_an_explicit_url():
    assert served_ui_url({}) == f"http://127.0.0.1:{DEFAULT_UI_PORT}"  # make ui
    assert served_ui_url({"DAGSTER_WEBSERVER_PORT": "3111"}) == "http://127.0.0.1:3111"
    assert served_ui_url({"DAGSTER_WEBSERVER_HOST": "0.0.0.0", "DAGSTER_WEBSERVER_PORT": "8080",
                          "DAGSTER_WEBSERVER_PATH_PREFIX": "/dagster/"}) == "http://127.0.0.1:8080/dagster"
    assert served_ui_url({"DAGSTER_WEBSERVER_HOST": "::1", "DAGSTER_WEBSERVER_PORT": "3001"}) == "http://[::1]:3001"
    assert served_ui_url({"DAGSTER_UI_URL": "https://dagster.example.org/", "DAGSTER_WEBSERVER_PORT": "3111"}) \
        == "https://dagster.example.org"
    with pytest.raises(ValueError, match="DAGSTER_WEBSERVER_PORT='thirty' is not a port number"):
        served_ui_url({"DAGSTER_WEBSERVER_PORT": "thirty"})
    with pytest.raises(ValueError, match="DAGSTER_UI_URL='dagster:3000' is not an http"):
        served_ui_url({"DAGSTER_UI_URL": "dagster:3000"})


def test_the_local_profile_links_runs_to_the_served_address(monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv("DAGSTER_UI_URL", raising=False)
    monkeypatch.setenv("DAGSTER_WEBSERVER_PORT", "3222")
    settings = Profile.from_environment().resources()["platform"]
    assert settings.run_url("abc") == "http://127.0.0.1:3222/runs/abc"


@pytest.mark.slow
def test_dagster_webserver_serves_where_the_links_point(tmp_path):
    """Started as ``dagster dev`` starts it, without -h/-p: it reads the same variables."""
    (tmp_path / "defs.py").write_text("import dagster as dg\n\ndefs = dg.Definitions()\n")
    (tmp_path / "workspace.yaml").write_text("load_from:\n  - python_file: defs.py\n")
    (port,) = free_ports(1)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")},
           "DAGSTER_HOME": str(tmp_path), "DAGSTER_WEBSERVER_HOST": "127.0.0.1", "DAGSTER_WEBSERVER_PORT": str(port)}
    link_base = served_ui_url(env)
    log = tmp_path / "webserver.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dagster_webserver", "-w", "workspace.yaml"], cwd=tmp_path,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_serving(proc, link_base, log, 180)
        with urllib.request.urlopen(f"{link_base}/runs", timeout=10) as page:
            assert page.status == 200
    finally:
        _stop_group(proc)
    assert f"Serving dagster-webserver on {link_base}" in log.read_text()


# --- gate records --------------------------------------------------------------------------------
def test_a_gate_record_holds_only_the_bounds_set():
    from pipelines.models.pydoc_corpus import pydoc_lm

    lm = pydoc_lm.gate.record([])
    assert lm == {"passed": True, "failures": [], "bounds": {"test_perplexity": {"max": 250}}}
    assert "min_test_accuracy" not in str(lm)
    classic = QualityGate(min_test_accuracy=0.9, max_test_loss=0.5).record(["test accuracy 0.8 is below 0.9"])
    assert classic == {"passed": False, "failures": ["test accuracy 0.8 is below 0.9"],
                       "bounds": {"test_accuracy": {"min": 0.9}, "test_loss": {"max": 0.5}}}


# --- a language model's continuations --------------------------------------------------------------
def test_a_language_models_lineage_shows_its_sampled_continuations():
    record = make_record(1, model="pydoc_lm")
    record["serving"] = {"continuations": [{"prompt": "The assert\nstatement", "continuation": " is a |way"},
                                           {"prompt": "Lists", "continuation": "  are  mutable"}]}
    rows = {r.field: r.value for r in lineage_rows(record)}
    assert rows["continuation 1"] == "'The assert statement' -> 'is a |way'"
    assert rows["continuation 2"] == "'Lists' -> 'are mutable'"
    assert "| continuation 1 | 'The assert statement' -> 'is a \\|way' |" in lineage_markdown(record)
    plain = make_record(1, model="digits")
    assert not [r for r in lineage_rows(plain) if r.field.startswith("continuation")]


# --- demo --help ------------------------------------------------------------------------------------
def test_demo_help_names_every_job_the_demo_runs():
    from pipelines.cli.demo import DEMO_HELP, DEMO_JOBS, demo_jobs
    from pipelines.cli.parser import build_parser

    assert demo_jobs() == DEMO_JOBS
    assert all(job in DEMO_HELP for job in DEMO_JOBS) and f"{len(DEMO_JOBS)} jobs" in DEMO_HELP
    demo = build_parser()._subparsers._group_actions[0].choices["demo"]
    assert demo.description == DEMO_HELP
