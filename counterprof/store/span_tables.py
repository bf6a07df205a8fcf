"""A run's spans as one table per rank, of chosen columns and categories (what `breakdown`
reads: its kernels, copies and steps; cpu ops, annotations... are left on disk; what
`collectives` reads, a rank at a time)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .reader import Run


def spans_by_rank(run: Run, columns: list[str], categories: Iterable[str],
                  ranks: list[int] | None = None) -> dict[int, Any]:
    """{rank: spans table} of the columns given (they hold "name" and "category"), rows of the
    categories given only, for ranks (default every rank); a rank with none is left out."""
    return dict(spans_rank_by_rank(run, columns, categories, ranks))


def spans_rank_by_rank(run: Run, columns: list[str], categories: Iterable[str],
                       ranks: list[int] | None = None) -> Iterator[tuple[int, Any]]:
    """(rank, spans table) as spans_by_rank gives them, one rank at a time in rank order, so
    that the caller lets each go before the next is read. The run's spans files are listed once
    for every rank, not once per rank (Run.rank_batches)."""
    import pyarrow as pa

    from ..ground.schema import SPANS_SCHEMA
    wanted = pa.array(list(categories))
    # names as dictionaries: a kernel's name recurs thousands of times (a 1 GB trace's spans
    # would otherwise hold hundreds of MB of repeated names)
    fields = [SPANS_SCHEMA.field(c) for c in columns]
    name_at, category_at = columns.index("name"), columns.index("category")
    fields[name_at] = pa.field("name", pa.dictionary(pa.int32(), pa.string()), nullable=False)
    schema = pa.schema(fields)
    chosen = [r for r in run.ranks() if not ranks or r in ranks]
    batches_of = run.rank_batches("spans", columns, chosen)
    for rank in chosen:
        table = _rank_table(batches_of(rank), name_at, category_at, wanted, schema)
        if table is not None:
            yield rank, table
            del table           # let go before the next rank is read


def _rank_table(batches: Iterator[Any], name_at: int, category_at: int, wanted: Any, schema: Any) -> Any:
    """One rank's spans of the wanted categories (None: it has none)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    parts = []
    for batch in batches:
        batch = batch.filter(pc.is_in(batch.column(category_at).cast(pa.string()), value_set=wanted))
        names = batch.column(name_at)
        if not pa.types.is_dictionary(names.type):
            batch = batch.set_column(name_at, "name", pc.dictionary_encode(names))
        parts.append(batch.cast(schema))
    if not parts:
        return None
    return pa.Table.from_batches(parts, schema=schema).unify_dictionaries()
