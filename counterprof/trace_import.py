"""Torch profiler traces into a run directory: the entry `counterprof import` calls, so that the
command line does not name the collector that reads them (collectors/torch_trace/importer.py).

The importer (pyarrow) loads when a function here is called: importing this module is free.
"""
from __future__ import annotations

import os
from collections.abc import Callable


def check_run_target(run: str | os.PathLike, replace: bool) -> None:
    """Refuse early, before any trace is read, a run directory the import could not create."""
    from .collectors.torch_trace import importer
    importer.check_run_target(run, replace)


def import_traces(paths: list[str | os.PathLike], run: str | os.PathLike, *, replace: bool = False,
                  default_rank: int = 0, command: list[str] | None = None,
                  on_trace: Callable | None = None) -> list:
    """Import the traces at paths (files, or directories searched for them) into the run
    directory run; the ImportedTrace of each, failed ones included (on_trace sees each as done)."""
    from .collectors.torch_trace import importer
    return importer.import_traces(paths, run, replace=replace, default_rank=default_rank,
                                  command=command, on_trace=on_trace)
