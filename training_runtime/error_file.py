"""The torchelastic error file, written so that the agent never reads half of one.

torchelastic's stock handler opens ``$TORCHELASTIC_ERROR_FILE`` with ``"w"`` and ``json.dump``s into
it. When one rank dies, the agent SIGTERMs the others; a survivor that is already recording its
own error (its peer's socket closed under it) can take that SIGTERM inside ``json.dump`` and exit
with the file empty. The agent then fails to parse it and crashes instead of restarting the group
(seen as ``JSONDecodeError`` in ``ProcessFailure.__post_init__``). Here the record goes to a
temporary file that is renamed into place, so the agent sees either a whole record or none (and
then reports the signal or exit code).
"""

import contextlib
import os

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler


class AtomicErrorHandler(ErrorHandler):
    _writing: str | None = None

    def _get_error_file_path(self) -> str | None:
        return self._writing or super()._get_error_file_path()

    def record_exception(self, e: BaseException) -> None:
        final = super()._get_error_file_path()
        if not final:
            super().record_exception(e)  # no file configured: torchelastic logs the record
            return
        self._writing = f"{final}.{os.getpid()}.tmp"
        try:
            super().record_exception(e)
            os.replace(self._writing, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._writing)  # interrupted: leave no file rather than half of one
            raise
        finally:
            self._writing = None
