"""FLOPs and bytes of one torch op from the shapes the profiler recorded (record_shapes).

    cost = op_cost("aten::addmm", [[768], [788, 768], [768, 768], [], []],
                   ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"])
    cost.flops, cost.bytes, cost.dtype, cost.family      # 930167808, 3601920, "bf16", "gemm"

One formula per op family, keyed by the op's name (as TraceLens does): GEMM (mm, addmm, bmm,
baddbmm, matmul, linear, _scaled_mm), convolution (forward, transposed, groups; backward),
attention (scaled_dot_product_attention and its flash / efficient / cudnn / CPU kernels,
forward and backward; causal halves the work), norms, softmax, embedding, elementwise
unary/binary, reductions, copy_.

FLOPs follow torch.utils.flop_counter.FlopCounterMode exactly (a multiply-add is 2 FLOPs, bias
and scaling not counted) except causal attention, which FlopCounterMode counts in full and
flash kernels skip half of: here it is half. Elementwise ops and reductions count one FLOP per
element, norms and softmax five (FlopCounterMode counts none of these). copy_ and embedding
count no FLOPs (TraceLens counts one per element for copy_: there is no arithmetic).

Bytes are the tensors read plus the tensors written, each once: a lower bound on the traffic
(caches can only add re-reads of what does not fit). A reduction's output is counted when its
dims were recorded (Concrete Inputs), else left out.

Input dims and types are the trace's "Input Dims" and "Input type": a tensor is a list of ints
with a dtype name ("float", "c10::BFloat16"), a 0-dim tensor is [] with a dtype, a Python
scalar is [] with "Scalar", a TensorList is a list of shapes with "TensorList".
None when the op has no cost model or its shapes do not fit the formula (say so: "no cost model").
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any
from collections.abc import Callable, Sequence

# dtype names as the profiler writes them -> (short name, bytes per element)
_DTYPES = {
    "float": ("fp32", 4), "float32": ("fp32", 4), "double": ("fp64", 8), "float64": ("fp64", 8),
    "c10::half": ("fp16", 2), "half": ("fp16", 2), "float16": ("fp16", 2),
    "c10::bfloat16": ("bf16", 2), "bfloat16": ("bf16", 2),
    "c10::float8_e4m3fn": ("fp8", 1), "c10::float8_e5m2": ("fp8", 1),
    "c10::float8_e4m3fnuz": ("fp8", 1), "c10::float8_e5m2fnuz": ("fp8", 1),
    "long int": ("int64", 8), "long": ("int64", 8), "int64": ("int64", 8),
    "int": ("int32", 4), "int32": ("int32", 4), "short int": ("int16", 2), "short": ("int16", 2),
    "signed char": ("int8", 1), "unsigned char": ("uint8", 1), "char": ("int8", 1),
    "bool": ("bool", 1), "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16), "c10::complex<c10::half>": ("complex32", 4),
}


@dataclass(frozen=True)
class OpCost:
    flops: int
    bytes: int           # read + written, each tensor once: a lower bound
    dtype: str | None    # the compute dtype (fp32, bf16, ...): which ceiling applies
    family: str          # gemm | conv | attention | norm | softmax | embedding | elementwise | reduction | copy

    @property
    def matrix(self) -> bool:
        """Runs on the matrix units (the matmul peak applies), not the vector units."""
        return self.family in ("gemm", "conv", "attention")


def dtype_info(name: Any) -> tuple[str, int] | None:
    """(short name, bytes per element) of a recorded Input type; None for scalars and lists."""
    if not isinstance(name, str):
        return None
    return _DTYPES.get(name.strip().lower())


class _Args:
    """The recorded inputs: the tensors (position -> shape, element size) and the concrete values."""

    def __init__(self, dims: list[Any], types: list[Any], concrete: list[Any] | None):
        self.dims, self.types = dims, types or []
        self.concrete = concrete or []
        self.tensors: dict[int, tuple[list[int], int]] = {}
        self.dtype = None
        for i, d in enumerate(dims):
            info = dtype_info(self.types[i]) if i < len(self.types) else None
            if info is None or not _is_shape(d):
                continue
            self.tensors[i] = (list(d), info[1])
            if self.dtype is None:
                self.dtype = info[0]

    def shape(self, i: int) -> list[int] | None:
        t = self.tensors.get(i)
        return t[0] if t else None

    def nbytes(self, i: int) -> int:
        t = self.tensors.get(i)
        return prod(t[0]) * t[1] if t else 0

    def esize(self, i: int = 0) -> int:
        t = self.tensors.get(i)
        return t[1] if t else (next(iter(self.tensors.values()))[1] if self.tensors else 0)

    def all_bytes(self) -> int:
        return sum(prod(s) * e for s, e in self.tensors.values())

    def value(self, i: int) -> Any:
        """A concrete input parsed: '[2, 2]' -> [2, 2], 'True' -> True, '1' -> 1; None if absent."""
        if i >= len(self.concrete):
            return None
        text = self.concrete[i]
        if not isinstance(text, str):
            return text
        text = text.strip()
        if not text:
            return None
        if text in ("True", "False"):
            return text == "True"
        if text.startswith("["):
            items = [x.strip() for x in text.strip("[]").split(",") if x.strip()]
            return [(x == "True") if x in ("True", "False") else _num(x) for x in items]
        return _num(text)


def _num(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _is_shape(d: Any) -> bool:
    return isinstance(d, list) and all(isinstance(x, int) for x in d)


# ---- GEMM ------------------------------------------------------------------------------------

def _gemm(m: int, k: int, n: int, batch: int = 1) -> int:
    return 2 * batch * m * n * k


def _mm(a: _Args, ia: int, ib: int, extra: Sequence[int] = ()) -> OpCost | None:
    sa, sb = a.shape(ia), a.shape(ib)
    if sa is None or sb is None or len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        return None
    m, k, n = sa[0], sa[1], sb[1]
    out = m * n * a.esize(ia)
    return OpCost(_gemm(m, k, n), a.nbytes(ia) + a.nbytes(ib) + sum(a.nbytes(i) for i in extra) + out,
                  a.dtype, "gemm")


def _bmm(a: _Args, ia: int, ib: int, extra: Sequence[int] = ()) -> OpCost | None:
    sa, sb = a.shape(ia), a.shape(ib)
    if sa is None or sb is None or len(sa) != 3 or len(sb) != 3 or sa[0] != sb[0] or sa[2] != sb[1]:
        return None
    b, m, k, n = sa[0], sa[1], sa[2], sb[2]
    out = b * m * n * a.esize(ia)
    return OpCost(_gemm(m, k, n, b), a.nbytes(ia) + a.nbytes(ib) + sum(a.nbytes(i) for i in extra) + out,
                  a.dtype, "gemm")


def _matmul(a: _Args) -> OpCost | None:
    """torch.matmul's broadcasting rules (1-D operands promoted, batch dims broadcast)."""
    sa, sb = a.shape(0), a.shape(1)
    if sa is None or sb is None or not sa or not sb:
        return None
    x = [1] + sa if len(sa) == 1 else sa
    y = sb + [1] if len(sb) == 1 else sb
    if x[-1] != y[-2]:
        return None
    bx, by = x[:-2], y[:-2]
    batch_shape = _broadcast(bx, by)
    if batch_shape is None:
        return None
    m, k, n = x[-2], x[-1], y[-1]
    batch = prod(batch_shape)
    out = batch * (m if len(sa) > 1 else 1) * (n if len(sb) > 1 else 1) * a.esize(0)
    return OpCost(_gemm(m, k, n, batch), a.nbytes(0) + a.nbytes(1) + out, a.dtype, "gemm")


def _linear(a: _Args) -> OpCost | None:
    x, w = a.shape(0), a.shape(1)
    if x is None or w is None or len(w) != 2 or not x or x[-1] != w[1]:
        return None
    rows = prod(x[:-1])
    out = rows * w[0] * a.esize(0)
    return OpCost(_gemm(rows, w[1], w[0]), a.nbytes(0) + a.nbytes(1) + a.nbytes(2) + out,
                  a.dtype, "gemm")


def _broadcast(x: list[int], y: list[int]) -> list[int] | None:
    out = []
    for i in range(1, max(len(x), len(y)) + 1):
        p = x[-i] if i <= len(x) else 1
        q = y[-i] if i <= len(y) else 1
        if p != q and 1 not in (p, q):
            return None
        out.append(max(p, q) if 1 not in (p, q) else p * q)
    return out[::-1]


# ---- convolution -----------------------------------------------------------------------------

def _conv_out(x: list[int], w: list[int], stride: Any, padding: Any, dilation: Any, transposed: bool,
              out_pad: Any, groups: int) -> list[int]:
    nd = len(x) - 2
    stride, padding, dilation = (_per_dim(v, nd) for v in (stride, padding, dilation))
    out_pad = _per_dim(out_pad or 0, nd)
    if transposed:
        spatial = [(x[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (w[2 + i] - 1)
                   + out_pad[i] + 1 for i in range(nd)]
        return [x[0], w[1] * groups] + spatial
    spatial = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
               for i in range(nd)]
    return [x[0], w[0]] + spatial


def _per_dim(v: int | list[int], nd: int) -> list[int]:
    if isinstance(v, list):
        return v * nd if len(v) == 1 else v
    return [v] * nd


def _conv_flops(x: list[int], w: list[int], out: list[int], transposed: bool) -> int:
    """FlopCounterMode's conv_flop_count: 2 * batch * prod(spatial) * prod(kernel) * w[0] * w[1]."""
    spatial = (x if transposed else out)[2:]
    return 2 * x[0] * prod(spatial) * prod(w[2:]) * w[0] * w[1]


def _convolution(a: _Args) -> OpCost | None:
    """aten::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)."""
    x, w = a.shape(0), a.shape(1)
    stride, padding, dilation = a.value(3), a.value(4), a.value(5)
    transposed, out_pad, groups = a.value(6), a.value(7), a.value(8)
    if x is None or w is None or len(x) < 3 or len(w) != len(x) or None in (stride, padding, dilation):
        return None      # stride/padding/dilation unrecorded (traces without Concrete Inputs)
    out = _conv_out(x, w, stride, padding, dilation, bool(transposed), out_pad, groups or 1)
    if min(out) <= 0:
        return None
    nbytes = a.nbytes(0) + a.nbytes(1) + a.nbytes(2) + prod(out) * a.esize(0)
    return OpCost(_conv_flops(x, w, out, bool(transposed)), nbytes, a.dtype, "conv")


def _convolution_backward(a: _Args) -> OpCost | None:
    """aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask): FlopCounterMode's formula."""
    go, x, w = a.shape(0), a.shape(1), a.shape(2)
    transposed, mask = a.value(7), a.value(10)
    if go is None or x is None or w is None or len(go) != len(x) or len(w) != len(x):
        return None
    mask = mask if isinstance(mask, list) and len(mask) == 3 else [True, True, False]
    transposed = bool(transposed)

    def t(s: list[int]) -> list[int]:
        return [s[1], s[0]] + list(s[2:])
    flops, written = 0, 0
    if mask[0]:
        flops += _conv_flops(go, w, x, not transposed)
        written += a.nbytes(1)
    if mask[1]:
        if transposed:
            flops += _conv_flops(t(go), t(x), t(w), False)
        else:
            flops += _conv_flops(t(x), t(go), t(w), False)
        written += a.nbytes(2)
    if mask[2]:
        written += (go[1]) * a.esize(0)
    return OpCost(flops, a.nbytes(0) + a.nbytes(1) + a.nbytes(2) + written, a.dtype, "conv")


# ---- attention -------------------------------------------------------------------------------

# position of is_causal in each op's schema (Concrete Inputs follow the schema)
_CAUSAL_AT = {
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_attention_math": 5,
    "aten::_scaled_dot_product_flash_attention_backward": 10,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 6,
    "aten::_scaled_dot_product_efficient_attention_backward": 10,
}


def _attention(name: str, a: _Args) -> OpCost | None:
    """q, k, v as [batch, heads, seq, dim] (GQA: fewer key/value heads); FlopCounterMode's
    sdpa_flop_count, halved when causal."""
    q, k, v = a.shape(0), a.shape(1), a.shape(2)
    if q is None or k is None or v is None or not len(q) == len(k) == len(v) == 4:
        return None
    b, h, sq, d = q
    _, hkv, sk, dk = k
    dv = v[3]
    if dk != d or k[0] != b or v[0] != b or v[2] != sk or hkv == 0 or h % hkv:
        return None
    flops = _gemm(sq, d, sk, b * h) + _gemm(sq, sk, dv, b * h)
    if a.value(_CAUSAL_AT.get(name, -1)) is True:
        flops //= 2
    out = b * h * sq * dv * a.esize(0)
    mask_bytes = sum(a.nbytes(i) for i in a.tensors if i >= 3)   # attn_mask / bias when given
    return OpCost(flops, a.nbytes(0) + a.nbytes(1) + a.nbytes(2) + mask_bytes + out, a.dtype, "attention")


def _attention_backward(name: str, a: _Args) -> OpCost | None:
    """(grad_out, q, k, v, out, ...): FlopCounterMode's sdpa_backward_flop_count (5 GEMMs)."""
    go, q, k, v = a.shape(0), a.shape(1), a.shape(2), a.shape(3)
    if go is None or q is None or k is None or v is None or not len(go) == len(q) == len(k) == len(v) == 4:
        return None
    b, h, sq, d = q
    sk, dv = k[2], v[3]
    flops = (_gemm(sq, d, sk, b * h) + _gemm(sq, dv, sk, b * h) + _gemm(sk, sq, dv, b * h)
             + _gemm(sq, sk, d, b * h) + _gemm(d, sq, sk, b * h))
    if a.value(_CAUSAL_AT.get(name, -1)) is True:
        flops //= 2
    read = sum(a.nbytes(i) for i in a.tensors)
    written = a.nbytes(1) + a.nbytes(2) + a.nbytes(3)           # grad q, k, v
    return OpCost(flops, read + written, a.dtype, "attention")


# ---- the rest: per element -------------------------------------------------------------------

def _first_tensor(a: _Args) -> int | None:
    return min(a.tensors) if a.tensors else None


def _elementwise(arity: int) -> Callable[[_Args], OpCost | None]:
    """Unary and binary ops: one FLOP per output element (the inputs broadcast), bytes: every
    tensor input read, the output written once (in place ops too: read, then written). A tensor
    past the schema's `arity` arguments is the out= tensor: written, not read."""
    def cost(a: _Args) -> OpCost | None:
        inputs = [i for i in a.tensors if i < arity]
        if not inputs:
            return None
        shape: list[int] = []
        for i in inputs:
            wider = _broadcast(shape, a.tensors[i][0])      # (a.shape(i): i is a tensor)
            if wider is None:
                return None
            shape = wider
        n = prod(shape)
        return OpCost(n, sum(a.nbytes(i) for i in inputs) + n * a.esize(inputs[0]), a.dtype, "elementwise")
    return cost


def _fill(a: _Args) -> OpCost | None:
    """fill_(self, value) / zero_(self): self written, nothing read (the value is a scalar); no
    FLOPs (FlopCounterMode counts none)."""
    if 0 not in a.tensors:
        return None
    return OpCost(0, a.nbytes(0), a.dtype, "elementwise")


def _copy(a: _Args) -> OpCost | None:
    """copy_(self, src): src read, self written."""
    if 0 not in a.tensors:
        return None
    return OpCost(0, a.nbytes(0) + (a.nbytes(1) if 1 in a.tensors else a.nbytes(0)), a.dtype, "copy")


def _reduction(a: _Args) -> OpCost | None:
    """sum/mean/amax...(input, dim, keepdim, ...): one FLOP per input element; the output's
    bytes when the reduced dims were recorded."""
    x = a.shape(0)
    if x is None:
        return None
    n = prod(x)
    out = 0
    dims = a.value(1)
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims):
        reduced = {d % len(x) for d in dims} if x and dims else set(range(len(x)))
        out = prod(s for i, s in enumerate(x) if i not in reduced) * a.esize(0)
    elif dims is None and len(a.dims) == 1:        # a full reduction: one element out
        out = a.esize(0)
    return OpCost(n, a.nbytes(0) + out, a.dtype, "reduction")


def _scan(a: _Args) -> OpCost | None:
    """cumsum/cumprod: one FLOP per element, output as big as the input."""
    x = a.shape(0)
    if x is None:
        return None
    return OpCost(prod(x), 2 * a.nbytes(0), a.dtype, "reduction")


def _per_element(flops_per_element: int, family: str) -> Callable[[_Args], OpCost | None]:
    """Norms and softmax: the first tensor in, the same shape out, the other tensors (weight,
    bias, running stats) read once."""
    def cost(a: _Args) -> OpCost | None:
        i = _first_tensor(a)
        if i is None or i != 0:
            return None
        n = prod(a.tensors[0][0])      # (a.shape(0): 0 is a tensor)
        return OpCost(flops_per_element * n, a.all_bytes() + a.nbytes(0), a.dtype, family)
    return cost


def _embedding(a: _Args) -> OpCost | None:
    """embedding(weight [V, D], indices): the indices read, one row read and written per index."""
    w, idx = a.shape(0), a.shape(1)
    if w is None or idx is None or len(w) != 2:
        return None
    rows = prod(idx) * w[1] * a.esize(0)
    return OpCost(0, a.nbytes(1) + 2 * rows, a.dtype, "embedding")


# arguments in the schema (default: 1 for unary, 2 for binary ops); out= comes after them
_ARITY = {"add": 3, "sub": 3, "rsub": 3, "where": 3, "masked_fill": 3, "lerp": 3,
          "threshold_backward": 3, "addcmul": 4, "addcdiv": 4, "clamp": 3, "clamp_min": 2,
          "clamp_max": 2, "hardtanh": 3, "leaky_relu": 2, "elu": 4, "softplus": 3, "gelu": 2,
          "nan_to_num": 4, "round": 2, "gelu_backward": 3, "hardtanh_backward": 4,
          "pow": 2, "div": 3}
_UNARY = ("abs", "neg", "exp", "exp2", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal",
          "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "silu", "mish", "erf", "sign",
          "floor", "ceil", "round", "trunc", "square", "hardtanh", "leaky_relu", "elu",
          "softplus", "hardswish", "hardsigmoid", "clamp", "clamp_min", "clamp_max", "logical_not",
          "bitwise_not", "nan_to_num")
_BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "fmod",
           "eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "logical_and",
           "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor", "lerp", "addcmul",
           "addcdiv", "threshold_backward", "gelu_backward", "silu_backward",
           "sigmoid_backward", "tanh_backward", "hardtanh_backward", "atan2", "rsub", "xlogy")
_REDUCE = ("sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "linalg_vector_norm",
           "var", "std", "var_mean", "std_mean", "argmax", "argmin", "any", "all", "logsumexp")


def _table() -> dict[str, Callable[[_Args], OpCost | None]]:
    t: dict[str, Callable[[_Args], OpCost | None]] = {
        "aten::mm": lambda a: _mm(a, 0, 1),
        "aten::addmm": lambda a: _mm(a, 1, 2, [0]),
        "aten::_scaled_mm": lambda a: _mm(a, 0, 1),
        "aten::bmm": lambda a: _bmm(a, 0, 1),
        "aten::baddbmm": lambda a: _bmm(a, 1, 2, [0]),
        "aten::matmul": _matmul,
        "aten::linear": _linear,
        "aten::convolution": _convolution,
        "aten::convolution_backward": _convolution_backward,
        "aten::layer_norm": _per_element(5, "norm"),
        "aten::rms_norm": _per_element(4, "norm"),
        "aten::group_norm": _per_element(5, "norm"),
        "aten::batch_norm": _per_element(5, "norm"),
        "aten::softmax": _per_element(5, "softmax"),
        "aten::_softmax": _per_element(5, "softmax"),
        "aten::log_softmax": _per_element(5, "softmax"),
        "aten::_log_softmax": _per_element(5, "softmax"),
        "aten::embedding": _embedding,
        "aten::copy_": _copy,
        "aten::cumsum": _scan,
        "aten::cumprod": _scan,
    }
    for name in _CAUSAL_AT:
        backward = name.endswith("_backward")
        t[name] = (lambda n: (lambda a: _attention_backward(n, a)))(name) if backward \
            else (lambda n: (lambda a: _attention(n, a)))(name)
    for base in _UNARY + _BINARY:
        arity = _ARITY.get(base, 1 if base in _UNARY else 2)
        t[f"aten::{base}"] = t[f"aten::{base}_"] = _elementwise(arity)
    for base in _REDUCE:
        t[f"aten::{base}"] = _reduction
    for name in ("aten::fill", "aten::fill_", "aten::zero_"):
        t[name] = _fill          # written only: a unary op's read would double its bytes
    return t


FORMULAS = _table()


def has_model(name: str) -> bool:
    return name in FORMULAS


# arguments of the GEMM schemas: a record with more than these and an out= is damaged
# (seen: an aten::matmul recorded with 14 tensors)
_GEMM_ARGS = {"aten::mm": 2, "aten::addmm": 5, "aten::bmm": 2, "aten::baddbmm": 5,
              "aten::matmul": 2, "aten::linear": 3}


def op_cost(name: str, input_dims: list[Any] | None, input_types: list[Any] | None,
            concrete_inputs: list[Any] | None = None) -> OpCost | None:
    """FLOPs and bytes of one call; None without a formula or with shapes it cannot use."""
    formula = FORMULAS.get(name)
    if formula is None or not isinstance(input_dims, list):
        return None
    if len(input_dims) > _GEMM_ARGS.get(name, len(input_dims)) + 1:
        return None
    try:
        return formula(_Args(input_dims, input_types if isinstance(input_types, list) else [],
                             concrete_inputs if isinstance(concrete_inputs, list) else None))
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None        # shapes the formula does not fit: counted as "no cost model"
