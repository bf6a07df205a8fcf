"""Traces into a run directory: the entry `counterprof import` calls, so that the command line
does not name the collectors that read them: torch profiler (Kineto) traces
(collectors/torch_trace/importer.py), JAX profiles (collectors/jax_trace/importer.py, which
converts the Kineto traces given with them too), and Neuron Explorer profile directories
(collectors/neuron/importer.py), alone, beside the others, or into an existing run.

The importers (pyarrow) load when a function here is called: importing this module is free.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def check_run_target(run: str | os.PathLike[str], replace: bool) -> None:
    """Refuse early, before any trace is read, a run directory the import could not create."""
    from .collectors.torch_trace import importer
    importer.check_run_target(run, replace)


def is_jax_profile(path: str | os.PathLike[str]) -> bool:
    """A file jax.profiler wrote (by its name and place; the standard library alone)."""
    from .collectors.jax_trace import is_profile_file
    return bool(is_profile_file(path))


def import_traces(paths: list[str | os.PathLike[str]], run: str | os.PathLike[str], *, replace: bool = False,
                  default_rank: int = 0, command: list[str] | None = None,
                  on_trace: Callable[[Any], None] | None = None,
                  file_ranks: dict[str, int] | None = None, into: bool = False) -> list[Any]:
    """Import the traces at paths (files, or directories searched for them) into the run
    directory run; the ImportedTrace of each, failed ones included (on_trace sees each as done).
    into: add to the existing finished run `run` (Neuron Explorer profiles only)."""
    from .collectors.neuron.profile_dirs import find_profiles
    neuron_dirs, paths = find_profiles(paths)
    if into and paths:
        from .ground.errors import CounterprofError
        raise CounterprofError("--into adds Neuron Explorer profiles to a run; these are not: "
                               + ", ".join(map(str, paths)) + " (import them into a new run with -o)")
    if neuron_dirs:
        from .collectors.neuron import importer as neuron_importer
        found: list[Any] = []
        if paths:      # the Kineto/JAX traces make the run; the profiles join it
            found = import_traces(paths, run, replace=replace, default_rank=default_rank, command=command,
                                  on_trace=on_trace, file_ranks=file_ranks)
        profiles: list[Any] = neuron_importer.import_profiles(
            neuron_dirs, run, replace=replace if not paths else False, into=into or bool(paths),
            default_rank=default_rank, command=command, on_trace=on_trace)
        return found + profiles
    from .collectors.jax_trace import split_paths
    jax_files, other = split_paths(paths)
    if jax_files:
        from .collectors.jax_trace import importer as jax_importer
        traces: list[Any] = jax_importer.import_traces(jax_files, other, run, replace=replace,
                                                       default_rank=default_rank, command=command,
                                                       on_trace=on_trace)
        return traces
    from .collectors.torch_trace import importer
    traces = importer.import_traces(paths, run, replace=replace, default_rank=default_rank,
                                    command=command, on_trace=on_trace, file_ranks=file_ranks)
    return traces
