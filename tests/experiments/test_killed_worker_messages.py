"""Pipes messages of a training whose run worker was SIGKILLed: what its reader had not read, and
what the training wrote before it ended, reach the retry's event log (issue 45: 14 of 156
validation lines of a killed sweep reached neither run's log)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from resources.launch.durable_messages import LOCK_FILE, catch_up, leftover_files, messages_file, read_offset

MESSAGES = 60

# The training stand-in: holds the training lock as the supervisor does, writes one Pipes log line
# per "validation" and a ledger line after each, and goes on after its launcher dies.
TRAINING = """
import fcntl, os, sys, time
from dagster_pipes import open_dagster_pipes
lock = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(lock, fcntl.LOCK_EX)
with open_dagster_pipes() as pipes:
    for i in range({n}):
        pipes.log.info(f"validation {{i}} of the trial")
        with open(sys.argv[2], "a") as f:
            f.write(f"{{i}}\\n")
        time.sleep(0.03)
"""

# The run worker: one asset launching the training through the local launcher's reader.
WORKER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
import dagster as dg
from resources.launch.durable_messages import LiveDurableFileMessageReader, messages_file

work = Path({work!r})

@dg.asset
def trial(context):
    reader = LiveDurableFileMessageReader(messages_file(work, "launch_0"), context=context)
    client = dg.PipesSubprocessClient(message_reader=reader)
    client.run(context=context, command=[sys.executable, "-c", {training!r}, str(work / {lock!r}),
                                         str(work / "ledger")])

with dg.DagsterInstance.from_config({home!r}) as instance:
    dg.materialize([trial], instance=instance)
"""


def _lines(instance: dg.DagsterInstance) -> list[str]:
    return [e.message for r in instance.get_runs() for e in instance.all_logs(r.run_id)
            if (e.message or "").startswith("validation ")]


def test_the_retry_reports_every_message_the_killed_worker_had_not_read(tmp_path):
    home, work = tmp_path / "home", tmp_path / "trial-002"
    home.mkdir()
    work.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    root = str(Path(__file__).resolve().parents[2])
    script = WORKER.format(root=root, work=str(work), home=str(home), lock=LOCK_FILE,
                           training=TRAINING.format(n=MESSAGES))
    worker = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    ledger = work / "ledger"
    try:
        deadline = time.monotonic() + 120
        while not ledger.exists() or len(ledger.read_text().splitlines()) < 10:
            assert time.monotonic() < deadline and worker.poll() is None, "the training never got going"
            time.sleep(0.01)
        os.kill(worker.pid, signal.SIGKILL)  # the run worker only: the training goes on, as an orphan would
    finally:
        worker.wait(30)
    (left,) = leftover_files(work)
    assert left == messages_file(work, "launch_0")
    at_kill = read_offset(left)
    assert 0 < at_kill  # the reader recorded how far it got

    with dg.DagsterInstance.from_config(str(home)) as instance:
        before = _lines(instance)
        assert len(before) < MESSAGES

        @dg.asset
        def trial(context):  # the retry: it waits for the training's lock, then reads
            return catch_up(context, work)

        result = dg.materialize([trial], instance=instance)
        assert result.success
        reported = result.output_for_node("trial")
        lines = _lines(instance)
    assert len(ledger.read_text().splitlines()) == MESSAGES  # the training ran to its end before the read
    # Every message in one log or the other; at most the one being handed on at the kill twice.
    assert sorted(set(lines)) == sorted(f"validation {i} of the trial" for i in range(MESSAGES))
    assert len(lines) - MESSAGES <= 1 and reported == MESSAGES - len(before) + (len(lines) - MESSAGES)
    assert not leftover_files(work) and not list((work / "pipes").glob("*.read"))
