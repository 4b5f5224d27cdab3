"""The torchelastic error file, written so that the agent never reads half of one.

torchelastic's stock handler opens ``$TORCHELASTIC_ERROR_FILE`` with ``"w"`` and ``json.dump``s into
it. When one rank dies, the agent SIGTERMs the others; a survivor that is already recording its
own error (its peer's socket closed under it) can take that SIGTERM inside ``json.dump`` and exit
with the file empty. The agent then fails to parse it and crashes instead of restarting the group
(seen as ``JSONDecodeError`` in ``ProcessFailure.__post_init__``). Here the record goes to a
temporary file that is renamed into place, so the agent sees either a whole record or none (and
then reports the signal or exit code).

``stop_elastic_agent`` is the other half of what a worker tells its agent: that a failure would
repeat, so the agent must not restart the workers (train/failures.py decides when).
"""

import os
import signal
import sys
import tempfile

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from training_runtime.atomic_files import atomic_path


class AtomicErrorHandler(ErrorHandler):
    _writing: str | None = None

    def _get_error_file_path(self) -> str | None:
        # While a record is written, torchelastic's handler opens the temporary, not the final file.
        return self._writing or super()._get_error_file_path()

    def record_exception(self, e: BaseException) -> None:
        final = super()._get_error_file_path()
        if not final:
            super().record_exception(e)  # no file configured: torchelastic logs the record
            return
        try:
            # Interrupted (SIGTERM) or failed, the temporary is deleted: no file rather than half of one.
            with atomic_path(final) as tmp:
                self._writing = str(tmp)
                super().record_exception(e)
        finally:
            self._writing = None


# ---------------------------------------------------------------- stopping torchrun's agent
def _is_elastic_agent(pid: int) -> bool:
    import psutil

    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return any(arg == "torch.distributed.run" or arg.endswith(("/torchrun", "torch/distributed/run.py"))
               for arg in cmdline)


def stop_elastic_agent(environ: dict[str, str] | None = None, marker_dir: str | None = None) -> bool:
    """SIGTERM this worker's torchrun agent, so that it stops every worker and exits instead of
    restarting them: ``--max-restarts`` restarts on any failure, and a failure that a new attempt
    would repeat must end the launch. Once per agent: the first rank of the node to ask claims a
    marker (in ``marker_dir``, the attempt's record folder, else the node's temporary directory),
    since a second SIGTERM would interrupt the agent's own shutdown. Called at exit, after this
    rank's error is recorded and printed. False when there is no agent to stop."""
    environ = os.environ if environ is None else environ
    run = environ.get("TORCHELASTIC_RUN_ID")
    agent = os.getppid()
    if not run or not _is_elastic_agent(agent):
        return False
    if marker_dir is not None:
        marker = os.path.join(marker_dir, f"agent-stopped.node{environ.get('GROUP_RANK', '0')}")
    else:
        restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        marker = os.path.join(tempfile.gettempdir(), f".training-runtime-stop-{agent}-{restart}-"
                              + "".join(c if c.isalnum() else "_" for c in run)[:64])
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    print(f"[rank{environ.get('RANK', '?')}] this failure would repeat in a restarted attempt: stopping torchrun's "
          f"agent (pid {agent}) instead of letting it restart the workers", file=sys.stderr, flush=True)
    os.kill(agent, signal.SIGTERM)
    return True
