"""The Arrow compute functions the trace conversion calls, with pyarrow.compute's names and
defaults, called through pyarrow._compute. Importing pyarrow.compute builds a Python wrapper,
docstring included, for each of Arrow's ~300 functions (~20 ms of a `counterprof import` that
calls eighteen of them); the Array methods that call them (cast, fill_null, drop_null, take,
filter) import it too, so the conversion calls these instead.

No numpy: `counterprof import` loads pyarrow without it (~45 ms of its start-up), so the
conversion's array work is Arrow's, and Python reads integer arrays through int_view.
"""
from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pyarrow import _compute

_call = _compute.call_function
# What pyarrow infers for a Python scalar, given up front: inferring loads dateutil (~1-3 ms)
_INFERRED = ((bool, pa.bool_()), (int, pa.int64()), (float, pa.float64()), (str, pa.string()))


def _scalar(value: Any) -> Any:
    """value as the Arrow scalar pyarrow.compute would make of it (others: unchanged)."""
    if value is None:
        return pa.scalar(None, pa.null())
    for kind, type_ in _INFERRED:
        if type(value) is kind:
            return pa.scalar(value, type_)
    return value


def and_(a: Any, b: Any) -> Any:
    return _call("and", [a, b])


def or_(a: Any, b: Any) -> Any:
    return _call("or", [a, b])


def invert(a: Any) -> Any:
    return _call("invert", [a])


def equal(a: Any, b: Any) -> Any:
    return _call("equal", [a, _scalar(b)])


def not_equal(a: Any, b: Any) -> Any:
    return _call("not_equal", [a, _scalar(b)])


def add(a: Any, b: Any) -> Any:
    return _call("add", [a, _scalar(b)])


def is_null(a: Any) -> Any:
    return _call("is_null", [a], _compute.NullOptions(nan_is_null=False))


def coalesce(*values: Any) -> Any:
    return _call("coalesce", list(values))


def if_else(cond: Any, left: Any, right: Any) -> Any:
    return _call("if_else", [cond, _scalar(left), _scalar(right)])


def starts_with(strings: Any, pattern: str) -> Any:
    return _call("starts_with", [strings], _compute.MatchSubstringOptions(pattern, ignore_case=False))


def is_in(values: Any, value_set: pa.Array) -> Any:
    return _call("is_in", [values], _compute.SetLookupOptions(value_set, skip_nulls=False))


def fill_null(values: Any, fill_value: Any) -> Any:
    """As pyarrow.compute.fill_null: the fill value as a scalar of the values' type."""
    if not isinstance(fill_value, (pa.Array, pa.ChunkedArray, pa.Scalar)):
        fill_value = pa.scalar(fill_value, type=values.type)
    elif values.type != fill_value.type:
        fill_value = pa.scalar(fill_value.as_py(), type=values.type)
    return _call("coalesce", [values, fill_value])


def take(data: Any, indices: Any) -> Any:
    return _call("take", [data, indices], _compute.TakeOptions(boundscheck=True))


def filter(data: Any, mask: Any) -> Any:
    return _call("filter", [data, mask], _compute.FilterOptions(null_selection_behavior="drop"))


def drop_null(data: Any) -> Any:
    return _call("drop_null", [data])


def cast(arr: Any, target_type: pa.DataType) -> Any:
    return _call("cast", [arr], _compute.CastOptions.safe(target_type))


def min(arr: Any) -> Any:
    return _call("min", [arr], _compute.ScalarAggregateOptions(skip_nulls=True, min_count=1))


def max(arr: Any) -> Any:
    return _call("max", [arr], _compute.ScalarAggregateOptions(skip_nulls=True, min_count=1))


def any_(arr: Any) -> bool:
    """Whether a boolean array holds a true (nulls skipped), as a Python bool."""
    return bool(_call("any", [arr], _compute.ScalarAggregateOptions(skip_nulls=True, min_count=1)).as_py())


def replace_with_mask(values: Any, mask: Any, replacements: Any) -> Any:
    """values with those where mask is true replaced by replacements, in order (a scatter)."""
    return _call("replace_with_mask", [values, mask, replacements])


def value_counts(arr: Any) -> Any:
    return _call("value_counts", [arr])


def dictionary_encode(arr: Any) -> Any:
    return _call("dictionary_encode", [arr], _compute.DictionaryEncodeOptions(null_encoding="mask"))


def indices_nonzero(arr: Any) -> Any:
    return _call("indices_nonzero", [arr])


# ---- Arrow arrays read from Python, without numpy ------------------------------------------

_IntFormat = Literal["q", "Q", "i", "I", "b", "B"]          # memoryview.cast's integer formats
_FORMATS: dict[pa.DataType, _IntFormat] = {pa.int64(): "q", pa.uint64(): "Q", pa.int32(): "i", pa.uint32(): "I",
                                           pa.int8(): "b", pa.uint8(): "B"}


def int_view(arr: pa.Array) -> memoryview:
    """The values of an integer array without nulls as a memoryview over its buffer (indexing
    gives Python ints; tolist() is C's loop, where to_pylist makes an Arrow scalar per value)."""
    fmt = _FORMATS[arr.type]
    size = arr.type.bit_width // 8
    data = arr.buffers()[1]
    n = len(arr)
    if data is None:              # an empty array
        return memoryview(b"").cast(fmt)
    return memoryview(data)[arr.offset * size:(arr.offset + n) * size].cast(fmt)


def bitmap(mask: pa.Array) -> pa.Buffer:
    """The bits of a boolean array without nulls, as a validity buffer of len(mask) values."""
    if mask.offset:             # (a slice: the kernels here make arrays at offset 0)
        mask = pa.concat_arrays([pa.array([], pa.bool_()), mask])
    return mask.buffers()[1]
