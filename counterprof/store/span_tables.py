"""A run's spans as one table per rank, of chosen columns and categories (what `breakdown`
reads: its kernels, copies and steps; cpu ops, annotations... are left on disk)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .reader import Run


def spans_by_rank(run: Run, columns: list[str], categories: Iterable[str],
                  ranks: list[int] | None = None) -> dict[int, Any]:
    """{rank: spans table} of the columns given (they hold "name" and "category"), rows of the
    categories given only, for ranks (default every rank); a rank with none is left out."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..ground.schema import SPANS_SCHEMA
    out = {}
    wanted = pa.array(list(categories))
    # names as dictionaries: a kernel's name recurs thousands of times (a 1 GB trace's spans
    # would otherwise hold hundreds of MB of repeated names)
    fields = [SPANS_SCHEMA.field(c) for c in columns]
    name_at, category_at = columns.index("name"), columns.index("category")
    fields[name_at] = pa.field("name", pa.dictionary(pa.int32(), pa.string()), nullable=False)
    schema = pa.schema(fields)
    for rank in run.ranks():
        if ranks and rank not in ranks:
            continue
        parts = []
        for batch in run.batches("spans", columns=columns, rank=rank):
            batch = batch.filter(pc.is_in(batch.column(category_at).cast(pa.string()), value_set=wanted))
            names = batch.column(name_at)
            if not pa.types.is_dictionary(names.type):
                batch = batch.set_column(name_at, "name", pc.dictionary_encode(names))
            parts.append(batch.cast(schema))
        if parts:
            out[rank] = pa.Table.from_batches(parts, schema=schema).unify_dictionaries()
    return out
