"""What a session writes its batches to: a sink.

    collectors --batch--> Session.emit --fan-out--> sinks: the journal (store/journal.py's
                                                    JournalSet, always first), then those given

A sink is anything with write(table, batch, rank) and close(): the journal writer, the live
view's window (live/window.py's LiveWindow), the --serve exporter (openmetrics.py's Exporter),
the summary's running sums (analysis/summary.py's Totals). Collectors' threads call write, each
from its own: a sink locks what it shares. A write that raises is said once per sink and the
run goes on; so is a close that raises.

A sink that shows rows as they come (the live view, a /metrics scrape) sets the class attribute
`fresh_rows = True`: collectors then hand rows over every second instead of holding them back
(perf's drain with its spill). It is optional, read with wants_fresh_rows().
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:       # annotations only: a module that names a sink need not load pyarrow
    import pyarrow as pa


class Sink(Protocol):
    """Where a session's batches go, as they come."""

    def write(self, table: str, batch: pa.RecordBatch, rank: int) -> None:
        """One batch of `table` ("samples" or "spans") for the partition of `rank`."""

    def close(self) -> None:
        """The run has stopped: no write comes after this."""


def wants_fresh_rows(sinks: Iterable[Sink]) -> bool:
    """Does one of these sinks show rows as they come (a `fresh_rows = True` attribute)?"""
    return any(getattr(sink, "fresh_rows", False) for sink in sinks)
