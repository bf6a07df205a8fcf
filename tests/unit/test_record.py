"""counterprof.ground.record against dataclasses: the same class body under @record and @dataclass
behaves the same (construction, errors, repr, equality, hashing, frozenness, the dataclasses
functions), and defining one compiles nothing."""
from __future__ import annotations

import builtins
import copy
import dataclasses
import pickle
from dataclasses import FrozenInstanceError, field

import pytest

from counterprof.ground.record import record


def _pair(frozen: bool):
    """The same body as a dataclass and as a record."""
    def body():
        class Point:
            """A point."""
            x: int
            y: int = 0
            tags: list = field(default_factory=list)
            note: str = field(default="", repr=False, compare=False)
            derived: int = field(init=False, default=-1)

            def __post_init__(self):
                object.__setattr__(self, "derived", self.x + self.y)

            def norm1(self) -> int:
                return abs(self.x) + abs(self.y)
        return Point
    return dataclasses.dataclass(frozen=frozen)(body()), record(frozen=frozen)(body())


@pytest.mark.parametrize("frozen", [False, True])
def test_construction_repr_eq_as_dataclass(frozen):
    for cls in _pair(frozen):
        a = cls(1, 2, ["t"], note="n")
        assert (a.x, a.y, a.tags, a.note, a.derived) == (1, 2, ["t"], "n", 3)
        assert repr(a) == "_pair.<locals>.body.<locals>.Point(x=1, y=2, tags=['t'], derived=3)"
        assert a == cls(1, 2, ["t"], note="other")            # note: compare=False
        assert a != cls(1, 3, ["t"])
        assert (a == 5) is False and a.__eq__(5) is NotImplemented
        b = cls(x=4)
        assert (b.y, b.tags, b.derived) == (0, [], 4)
        assert cls(1).tags is not cls(1).tags                 # a fresh default per instance
        assert cls.__match_args__ == ("x", "y", "tags", "note")
        assert b.norm1() == 4


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, "missing 1 required"),
    ((1, 2, [], "n", 9), {}, "positional arguments but"),
    ((1,), {"x": 2}, "multiple values for argument 'x'"),
    ((1,), {"derived": 2}, "unexpected keyword argument 'derived'"),
    ((1,), {"nope": 2}, "unexpected keyword argument 'nope'"),
])
def test_bad_arguments_are_refused_as_dataclass(frozen, args, kwargs, message):
    for cls in _pair(frozen):
        with pytest.raises(TypeError, match=message):
            cls(*args, **kwargs)


def test_frozen_refuses_assignment_and_hashes_as_dataclass():
    dc, rec = _pair(True)
    for cls in (dc, rec):
        a = cls(1, 2)
        with pytest.raises(FrozenInstanceError, match="cannot assign to field 'x'"):
            a.x = 5
        with pytest.raises(FrozenInstanceError, match="cannot delete field 'x'"):
            del a.x
        with pytest.raises(FrozenInstanceError):
            a.other = 1                       # the class itself: no new attributes either
    # hash of the compared fields; tags is a list, so give hashable ones
    assert hash(rec(1, 2, ())) == hash(dc(1, 2, ())) == hash((1, 2, (), 3))
    assert len({rec(1, 2, ()), rec(1, 2, ())}) == 1


def test_plain_is_unhashable_mutable_as_dataclass():
    dc, rec = _pair(False)
    for cls in (dc, rec):
        a = cls(1)
        a.x = 7
        assert a.x == 7
        assert cls.__hash__ is None
        with pytest.raises(TypeError, match="unhashable"):
            hash(a)


def test_dataclasses_functions_work_on_records():
    dc, rec = _pair(True)
    a = rec(1, 2, ["t"], note="n")
    assert dataclasses.is_dataclass(a) and dataclasses.is_dataclass(rec)
    assert [f.name for f in dataclasses.fields(a)] == [f.name for f in dataclasses.fields(dc)]
    assert dataclasses.asdict(a) == dataclasses.asdict(dc(1, 2, ["t"], note="n"))
    b = dataclasses.replace(a, y=5)
    assert (b.x, b.y, b.derived, b.note) == (1, 5, 6, "n") and type(b) is rec
    assert dataclasses.astuple(a) == (1, 2, ["t"], "n", 3)
    assert copy.deepcopy(a) == a
    kept = Pickled(1, "a")
    assert pickle.loads(pickle.dumps(kept)) == kept


@record(frozen=True)
class Pickled:
    a: int
    b: str = ""


def test_explicit_methods_are_kept():
    @record(frozen=True)
    class Key:
        a: int
        b: str = ""

        def __hash__(self) -> int:
            return 42

        def __repr__(self) -> str:
            return "Key!"

    assert hash(Key(1)) == 42 and repr(Key(1)) == "Key!" and Key(1) == Key(1)

    @record
    class Named:
        a: int

        def __eq__(self, other):
            return True
    assert Named(1) == Named(2) and Named.__hash__ is None


def test_inheritance_between_records():
    @record(frozen=True)
    class Base:
        a: int
        b: int = 1

    @record(frozen=True)
    class Child(Base):
        c: int = 2

    c = Child(5, c=7)
    assert (c.a, c.b, c.c) == (5, 1, 7)
    assert repr(c).endswith("Child(a=5, b=1, c=7)")
    assert c != Base(5, 1) and Base(5) == Base(5, 1)

    class Plain(Base):         # not decorated: the base's fields, methods and frozenness
        pass
    p = Plain(3)
    assert (p.a, p.b) == (3, 1)
    p.extra = 1                # a subclass's own attributes may be set, as with dataclasses
    with pytest.raises(FrozenInstanceError):
        p.a = 2


def test_definition_errors_as_dataclass():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @record
        class Bad:
            a: int = 0
            b: int
    with pytest.raises(ValueError, match="mutable default"):
        @record
        class Mutable:
            a: list = []
    with pytest.raises(TypeError, match="InitVar"):
        @record
        class WithInitVar:
            a: dataclasses.InitVar[int]
    with pytest.raises(TypeError, match="frozen and a non-frozen"):
        @record(frozen=True)
        class F:
            a: int

        @record
        class G(F):
            b: int = 0
    with pytest.raises(TypeError, match="cannot extend the dataclass"):
        @dataclasses.dataclass
        class D:
            a: int

        @record
        class E(D):
            b: int = 0
    with pytest.raises(TypeError, match="cannot overwrite attribute __setattr__"):
        @record(frozen=True)
        class S:
            a: int

            def __setattr__(self, name, value):
                pass


def test_defining_a_record_compiles_nothing(monkeypatch):
    """The point of it: no exec or compile per class (dataclasses runs one per method)."""
    calls = []
    real_exec, real_compile = builtins.exec, builtins.compile
    monkeypatch.setattr(builtins, "exec", lambda *a, **k: calls.append("exec") or real_exec(*a, **k))
    monkeypatch.setattr(builtins, "compile", lambda *a, **k: calls.append("compile") or real_compile(*a, **k))

    @record(frozen=True)
    class R:
        a: int
        b: str = "x"
        c: list = field(default_factory=list)

    assert calls == [] and R(1).b == "x"
    dataclasses.dataclass(frozen=True)(type("D", (), {"__annotations__": {"a": "int"}}))
    assert calls, "the check itself would see dataclasses' exec"


def test_no_docstring_gets_the_field_names():
    @record
    class NoDoc:
        a: int
        b: int = 0
    assert NoDoc.__doc__ == "NoDoc(a, b)"
