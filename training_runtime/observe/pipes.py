"""Dagster Pipes reporter for rank 0. The only module besides the entry point that imports
``dagster_pipes``; used only when the process was launched by Dagster (DAGSTER_PIPES_CONTEXT set)."""

from __future__ import annotations

import logging
from typing import Any

from dagster_pipes import PipesContext, open_dagster_pipes

log = logging.getLogger("training_runtime")


class PipesReporter:
    """Progress lines go to ``pipes.log.info`` (and the local log), telemetry and the final figures
    to ``report_custom_message``. As a context manager it closes the Pipes connection, passing an
    exception that ends the run on to Dagster."""

    def __init__(self) -> None:
        self.pipes: PipesContext = open_dagster_pipes()

    def info(self, message: str) -> None:
        log.info(message)
        self.pipes.log.info(message)

    def custom(self, payload: dict[str, Any]) -> None:
        self.pipes.report_custom_message(payload)

    def __enter__(self) -> PipesReporter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.pipes.__exit__(exc_type, exc, tb)
