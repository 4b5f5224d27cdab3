"""The torchelastic error file, written so that the agent never reads half of one.

torchelastic's stock handler opens ``$TORCHELASTIC_ERROR_FILE`` with ``"w"`` and ``json.dump``s into
it. When one rank dies, the agent SIGTERMs the others; a survivor that is already recording its
own error (its peer's socket closed under it) can take that SIGTERM inside ``json.dump`` and exit
with the file empty. The agent then fails to parse it and crashes instead of restarting the group
(seen as ``JSONDecodeError`` in ``ProcessFailure.__post_init__``). Here the record goes to a
temporary file that is renamed into place, so the agent sees either a whole record or none (and
then reports the signal or exit code).
"""

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
