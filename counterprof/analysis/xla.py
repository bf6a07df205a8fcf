"""XLA's ops as the compute device's work (JAX runs: collectors/jax_trace).

On the CPU a JAX job's compute runs as XLA ops (spans of category "xla_op", device null) on
XLA's own worker threads, while the Python main thread dispatches (PjitFunction) and then waits
(block_until_ready, device_get). So the torch model (the main thread's own ops are the work)
does not fit; the device model does, as for a GPU: the union of the XLA ops' intervals is the
device working, the time within the traced span when no XLA op runs is the device waiting on
the host (Python dispatch, the input pipeline).

What each op's busy time is: collectives (all-reduce & co., category "collective") are
collectives; the rest is compute or memory. No XLA op on the CPU carries its FLOPs or bytes
(convert.py: only TPU events do; the conversion adds XLA's cost analysis where it can), and a
ridge point needs ceilings. Without both the ops are classed by their HLO category (xprof's: a
fusion by the heaviest op it holds):
dot and convolution (and their fusions), the linear-algebra and FFT ops: compute candidates;
loop, input (reduction), scatter and gather fusions, elementwise ops, copies and data movement:
memory candidates (little arithmetic per byte); anything else stays undecided (compute|memory).
This is a heuristic by op kind, not a measured roofline, and the evidence says so. Where the
run's roofline decides (the conversion attached XLA's cost analysis to each op and the run has
ceilings: analysis/roofline.py's XLA path), classify._classify_xla splits the XLA ops' busy time
by it instead (each op's intensity against the ridge point), and says which was used.
"""
from __future__ import annotations

import re

# the XLA op's class: compute | memory | communication | other (undecided)
COMPUTE, MEMORY, COMMUNICATION, OTHER = "compute", "memory", "communication", "other"

_COMPUTE_OPCODES = frozenset((
    "dot", "convolution", "cholesky", "triangular-solve", "fft", "ragged-dot"))
_MEMORY_OPCODES = frozenset((
    # elementwise: a few FLOPs per element read and written
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "complex", "convert", "cosine",
    "divide", "erf", "exponential", "exponential-minus-one", "floor", "imag", "is-finite", "log",
    "log-plus-one", "logistic", "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt",
    "power", "real", "reduce-precision", "remainder", "round-nearest-afz", "round-nearest-even",
    "rsqrt", "select", "shift-left", "shift-right-arithmetic", "shift-right-logical", "sign",
    "sine", "sqrt", "subtract", "tan", "tanh", "xor", "bitcast-convert", "iota", "rng",
    "rng-bit-generator",
    # data movement and reductions
    "copy", "copy-start", "copy-done", "transpose", "broadcast", "concatenate", "slice",
    "dynamic-slice", "dynamic-update-slice", "pad", "reverse", "reshape", "gather", "scatter",
    "reduce", "reduce-window", "select-and-scatter"))
_COLLECTIVES = frozenset(("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
                          "all-to-all", "ragged-all-to-all", "collective-broadcast"))
_MEMORY_FUSIONS = ("loop fusion", "input fusion", "reduce fusion", "scatter fusion", "gather fusion")
_COMPUTE_FUSIONS = ("dot fusion", "convolution fusion")

_FIELD = {k: re.compile(rf'"{k}":"([^"]*)"') for k in ("category", "opcode")}


def field(attrs: str | None, key: str) -> str | None:
    """One string field of an op's attrs JSON (read by pattern: a run holds many ops)."""
    if not attrs:
        return None
    m = _FIELD[key].search(attrs)
    return m.group(1) if m else None


def op_class(category: str | None, opcode: str | None, name: str | None = None) -> str:
    """An XLA op's class from its HLO category and opcode (the module docstring's heuristic)."""
    cat = (category or "").lower()
    op = (opcode or "").lower()
    if cat.removesuffix(" fusion") in _COLLECTIVES or \
            op.removesuffix("-start").removesuffix("-done") in _COLLECTIVES:
        return COMMUNICATION
    if cat in _COMPUTE_FUSIONS or op in _COMPUTE_OPCODES or cat in _COMPUTE_OPCODES:
        return COMPUTE
    if cat in _MEMORY_FUSIONS or op in _MEMORY_OPCODES or cat in _MEMORY_OPCODES:
        return MEMORY
    if not cat and not op and name:      # no HLO for the op (a Chrome trace): its name's opcode
        base = re.sub(r"[.\d]+$", "", name.lower())
        return op_class(base, base)
    return OTHER


HOST_PART = "XLA threads idle (Python dispatch, input)"
