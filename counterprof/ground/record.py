"""`@record`: dataclasses whose methods are shared functions, not code compiled per class.

On Python 3.11 `@dataclass` writes each method it adds (__init__, __repr__, __eq__, and for a
frozen class __setattr__, __delattr__, __hash__) as source text and compiles it with exec:
~0.8 ms a plain class, ~1.5 ms a frozen one, here. A `counterprof run` defines ~30 of them
before it starts the workload, ~25 ms of its start-up. `@record` lets dataclasses do
everything but those methods (the fields, their defaults and checks, __match_args__, so
`dataclasses.fields`, `asdict`, `replace` and `is_dataclass` work as on any dataclass) and
gives the class the functions below, which read a per-class table of its fields.

What it supports is what counterprof uses: plain and frozen classes, defaults,
`field(default=..., default_factory=..., init=..., repr=..., compare=...)`, `__post_init__`,
an explicit `__hash__`, inheritance between records. Anything else (InitVar, kw_only, slots,
order) is refused when the class is defined: use `dataclasses.dataclass` there.
tests/unit/test_record.py holds it to `@dataclass` class by class.
"""
from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import MISSING, FrozenInstanceError
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:   # typing has it from 3.11; only type checkers read it
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_kw: Any) -> Any:
        return lambda f: f

T = TypeVar("T")
_SPEC = "__record_spec__"


class _Spec:
    """A record class's fields, as its shared methods need them."""

    __slots__ = ("cls", "frozen", "init", "required", "names", "set_in_init", "repr", "compare",
                 "post_init")

    def __init__(self, cls: type, frozen: bool):
        fields = dataclasses.fields(cls)    # in definition order, base classes' first
        self.cls = cls
        self.frozen = frozen
        self.init = tuple(f.name for f in fields if f.init)
        self.required = frozenset(f.name for f in fields if f.init
                                  and f.default is MISSING and f.default_factory is MISSING)
        self.names = frozenset(f.name for f in fields)
        # (name, default, default_factory, init) of every field __init__ sets
        self.set_in_init = tuple((f.name, f.default, f.default_factory, f.init) for f in fields
                                 if f.init or f.default is not MISSING
                                 or f.default_factory is not MISSING)
        self.repr = tuple(f.name for f in fields if f.repr)
        self.compare = tuple(f.name for f in fields if f.compare)
        self.post_init = hasattr(cls, "__post_init__")


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = getattr(type(self), _SPEC)
    name = type(self).__qualname__
    if len(args) > len(spec.init):
        raise TypeError(f"{name}.__init__() takes {len(spec.init) + 1} positional arguments "
                        f"but {len(args) + 1} were given")
    given = dict(zip(spec.init, args))
    for key, value in kwargs.items():
        if key in given:
            raise TypeError(f"{name}.__init__() got multiple values for argument '{key}'")
        if key not in spec.init:             # no such field, or one with init=False
            raise TypeError(f"{name}.__init__() got an unexpected keyword argument '{key}'")
        given[key] = value
    missing = [n for n in spec.init if n in spec.required and n not in given]
    if missing:
        raise TypeError(f"{name}.__init__() missing {len(missing)} required argument"
                        f"{'s' if len(missing) > 1 else ''}: {', '.join(map(repr, missing))}")
    for field_name, default, factory, init in spec.set_in_init:
        if init and field_name in given:
            value = given[field_name]
        elif factory is not MISSING:
            value = factory()
        else:
            value = default
        object.__setattr__(self, field_name, value)
    if spec.post_init:
        self.__post_init__()


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    spec: _Spec = getattr(type(self), _SPEC)
    inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in spec.repr)
    return f"{type(self).__qualname__}({inner})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = getattr(type(self), _SPEC).compare
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in getattr(type(self), _SPEC).compare))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    spec: _Spec = getattr(type(self), _SPEC)
    if type(self) is spec.cls or name in spec.names:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _frozen_delattr(self: Any, name: str) -> None:
    spec: _Spec = getattr(type(self), _SPEC)
    if type(self) is spec.cls or name in spec.names:
        raise FrozenInstanceError(f"cannot delete field {name!r}")
    object.__delattr__(self, name)


def _make(cls: type[T], frozen: bool) -> type[T]:
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base) and _SPEC not in base.__dict__:
            raise TypeError(f"{cls.__qualname__}: @record cannot extend the dataclass "
                            f"{base.__qualname__}; make both records or both dataclasses")
        base_spec = base.__dict__.get(_SPEC)
        if base_spec is not None and base_spec.frozen != frozen:
            raise TypeError(f"{cls.__qualname__}: a frozen and a non-frozen record cannot "
                            f"extend one another ({base.__qualname__})")
    own = cls.__dict__
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    doc = own.get("__doc__")
    if not doc:
        cls.__doc__ = "-"    # dataclasses would read the class's signature to write one
    # everything but the methods: no exec
    dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    for f in cls.__dataclass_fields__.values():   # type: ignore[attr-defined]
        if f._field_type is dataclasses._FIELD_CLASSVAR:   # type: ignore[attr-defined]
            continue
        if f._field_type is not dataclasses._FIELD:   # type: ignore[attr-defined]
            raise TypeError(f"{cls.__qualname__}.{f.name}: @record does not take InitVar "
                            f"fields; use dataclasses.dataclass")
        if f.kw_only is True:
            raise TypeError(f"{cls.__qualname__}.{f.name}: @record does not take kw_only "
                            f"fields; use dataclasses.dataclass")
    fields = dataclasses.fields(cls)   # type: ignore[arg-type]
    seen_default = ""
    for f in fields:
        if not f.init:
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            seen_default = f.name
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
    if not doc:
        cls.__doc__ = f"{cls.__name__}({', '.join(f.name for f in fields if f.init)})"
    setattr(cls, _SPEC, _Spec(cls, frozen))
    methods: Any = cls      # type checkers refuse assigning to a class's methods
    # the same methods @dataclass would add, where the class does not define its own
    for name, fn in (("__init__", _init), ("__repr__", _repr), ("__eq__", _eq)):
        if name not in own:
            setattr(cls, name, fn)
    if frozen:
        for name in ("__setattr__", "__delattr__"):
            if name in own:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
        methods.__setattr__ = _frozen_setattr
        methods.__delattr__ = _frozen_delattr
    if not explicit_hash:
        methods.__hash__ = _hash if frozen else None
    return cls


@overload
def record(cls: type[T], /) -> type[T]: ...
@overload
def record(*, frozen: bool = False) -> Any: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def record(cls: type[T] | None = None, /, *, frozen: bool = False) -> Any:
    """`@record` or `@record(frozen=True)`: as `@dataclass` / `@dataclass(frozen=True)`."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)
