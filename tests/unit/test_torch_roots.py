"""The torch driver's outermost forwards, in this process with real torch (issue 35): global
forward hooks only while the loop's outermost modules (its roots) are looked for, then a wrapper
of each root alone, so every other module call takes nn.Module's fast path between windows; the
roots found again when the loop moves to a module not seen before; the wrappers gone from
pickles, copies, DataParallel replicas, forked children and once a higher kind of mark rules;
and the stack sampler asleep between windows. Whole processes: tests/integration/test_torch_steps.py."""
from __future__ import annotations

import copy
import importlib.util
import pickle
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.nn.modules import module as nn_module  # noqa: E402

DRIVER = (Path(__file__).resolve().parents[2] / "collectors" / "torch_trace" / "bootstrap"
          / "_counterprof_torch_driver.py")


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("_roots_under_test", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def drv(mod, tmp_path):
    """A driver with its forward hooks only (no threads, no profiler windows, nothing patched
    beyond this test), taken down after it."""
    before = (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks))
    d = mod.Driver(str(tmp_path), paced=True, time_paced=True)
    d.start = lambda step=None: None          # no window: the steps alone
    d.next_window_at = time.monotonic() + 3600      # none due: the roots' calls only timed
    d._global_pair = d._forward_hooks_pair()
    d._register_global_hooks()
    yield d
    d._remove_forward_hooks()
    assert (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)) == before


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def forward(self, x):
        return self.b(self.a(x))


def steps(d) -> int:
    return len(d.step_records())


def forwards(d) -> int:
    d.step_records()                    # (the roots' calls timed since, counted)
    return d.forwards


def ours_registered() -> bool:
    return bool(nn_module._global_forward_pre_hooks or nn_module._global_forward_hooks)


def test_after_the_first_forwards_no_global_hook_is_left_and_every_forward_is_a_step(mod, drv):
    net, x = Net(), torch.randn(1, 4)
    assert ours_registered()
    calls = 3 * mod.ROOT_AFTER_FORWARDS
    for i in range(calls):
        net(x)
        if i + 1 >= mod.ROOT_AFTER_FORWARDS:
            # every module call in the process takes the fast path again: no global hook
            assert not ours_registered() and drv._roots_on[0], i
    assert drv.marks == "forward" and forwards(drv) == calls
    assert steps(drv) == calls - 1                      # the last one ends at the next mark
    numbers = [r[0] for r in drv.step_records()]
    assert numbers == list(range(calls - 1))
    ends = [(r[1], r[2]) for r in drv.step_records()]
    assert all(a < b for a, b in ends) and all(b1 <= a2 for (_, b1), (a2, _) in zip(ends, ends[1:]))
    assert "_compiled_call_impl" in net.__dict__                   # the root's own wrapper
    assert not any("_compiled_call_impl" in m.__dict__ for m in net.modules() if m is not net)


def test_calls_only_timed_and_calls_that_do_more_count_the_same_steps(mod, drv):
    """Between windows a root's call is only timed (its times appended, counted later); where
    a window may start every call goes the whole way. Mixed, the steps are the same: every
    call one, in order, each starting after the last one ended."""
    net, x = Net(), torch.randn(1, 4)
    for _ in range(mod.ROOT_AFTER_FORWARDS):
        net(x)
    assert drv._roots_on[0]
    for i in range(60):
        if i % 20 == 0:                 # a window due from here (or not): the next call sets due
            drv.next_window_at = 0.0 if i % 40 == 0 else time.monotonic() + 3600
            drv._due[0] = 0
        net(x)
        if i % 20 == 1:
            assert len(drv._fast) == 0 if i % 40 == 1 else len(drv._fast) == 3
    calls = mod.ROOT_AFTER_FORWARDS + 60
    records = drv.step_records()
    assert [r[0] for r in records] == list(range(calls - 1)) and forwards(drv) == calls
    assert all(r[1] < r[2] <= q[1] for r, q in zip(records, records[1:]))
    advances = calls - 1 - (mod.FORWARDS_TO_TRUST - 1)     # (the steps held until trusted: once)
    assert drv.sched == drv.every - drv.warmup + advances
    assert len(drv._intervals) == min(advances - 1, mod.STEP_INTERVALS_KEPT)


def test_a_root_called_inside_another_root_is_not_a_step_of_its_own(mod, drv):
    net, x = Net(), torch.randn(1, 4)

    class Wrap(torch.nn.Module):        # a root too, that calls the other one
        def __init__(self):
            super().__init__()
            self.inner = net

        def forward(self, x):
            return self.inner(x)

    wrap = Wrap()
    for _ in range(mod.ROOT_AFTER_FORWARDS):
        net(x)
        wrap(x)
    assert drv._roots_on[0] and "_compiled_call_impl" in net.__dict__ and "_compiled_call_impl" in wrap.__dict__
    before = forwards(drv)
    wrap(x)
    assert forwards(drv) == before + 1
    net(x)
    assert forwards(drv) == before + 2


def test_a_wrapped_root_pickles_and_copies_without_its_wrapper(mod, drv):
    net, x = Net(), torch.randn(1, 4)
    for _ in range(mod.ROOT_AFTER_FORWARDS + 1):
        net(x)
    assert drv._roots_on[0]
    for other in (pickle.loads(pickle.dumps(net)), copy.deepcopy(net), copy.copy(net),
                  net._replicate_for_data_parallel()):           # (DataParallel's replicas)
        assert "_compiled_call_impl" not in other.__dict__
        assert torch.equal(other(x), net(x))


def test_a_higher_mark_or_a_fork_takes_the_wrappers_away(mod, drv):
    net, x = Net(), torch.randn(1, 4)
    for _ in range(mod.ROOT_AFTER_FORWARDS + 1):
        net(x)
    assert "_compiled_call_impl" in net.__dict__
    drv.mark("optimizer")
    assert "_compiled_call_impl" not in net.__dict__ and not ours_registered()
    assert not drv._roots_on[0]
    n = forwards(drv)
    net(x)
    assert forwards(drv) == n


def test_a_forked_child_keeps_no_wrapper(mod, drv):
    net, x = Net(), torch.randn(1, 4)
    for _ in range(mod.ROOT_AFTER_FORWARDS + 1):
        net(x)
    drv._forked()                       # (what runs in a DataLoader worker after the fork)
    assert "_compiled_call_impl" not in net.__dict__ and drv.stopped == "forked child"


def test_a_module_seen_first_later_is_found_once_the_roots_go_quiet(mod, drv):
    old, x = Net(), torch.randn(1, 4)
    for _ in range(mod.ROOT_AFTER_FORWARDS + 1):
        old(x)
    new = Net()                         # a model reloaded: its calls are not seen yet
    n = forwards(drv)
    new(x)
    assert forwards(drv) == n
    now = time.monotonic()
    drv._check_roots(now)               # the flusher's look, once a second
    assert drv._roots_on[0]
    drv._check_roots(now + mod.REDISCOVER_S + 0.1)       # no root called for REDISCOVER_S
    assert not drv._roots_on[0] and ours_registered()
    for _ in range(mod.ROOT_AFTER_FORWARDS):
        new(x)
    assert forwards(drv) == n + mod.ROOT_AFTER_FORWARDS and drv._roots_on[0] and not ours_registered()
    assert "_compiled_call_impl" in new.__dict__
    m = forwards(drv)
    new(x)
    old(x)                              # (still wrapped: both count)
    assert forwards(drv) == m + 2


def test_the_roots_are_not_looked_for_while_another_thread_is_inside_a_module(mod, drv):
    net, x = Net(), torch.randn(1, 4)
    for _ in range(mod.ROOT_AFTER_FORWARDS + 1):
        net(x)
    entered, release = threading.Event(), threading.Event()

    class Slow(torch.nn.Module):
        def forward(self, x):
            entered.set()
            release.wait(10)
            return x

    t = threading.Thread(target=lambda: Slow()(x))
    t.start()
    try:
        assert entered.wait(10)
        now = time.monotonic()
        drv._check_roots(now)
        drv._check_roots(now + mod.REDISCOVER_S + 0.1)
        assert drv._roots_on[0] and not ours_registered()      # tried again later
    finally:
        release.set()
        t.join()
    drv._check_roots(now + 2 * mod.REDISCOVER_S + 0.2)
    assert not drv._roots_on[0] and ours_registered()


def test_the_stack_sampler_sleeps_between_windows(mod, tmp_path):
    d = mod.Driver(str(tmp_path))
    waits = []
    wake = d._wake

    class Counting(type(wake)):
        def wait(self, timeout=None):
            waits.append(timeout)
            return super().wait(timeout)

    d._wake = Counting()
    t = threading.Thread(target=d._pystack_loop, daemon=True)
    t.start()
    time.sleep(0.3)                     # no window: 15 wake-ups at 50 Hz before
    assert waits == []
    d.prof = object()                   # a window records: sampled every PYSAMPLE_S
    d._sampling.set()
    deadline = time.monotonic() + 5
    while len(waits) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(waits) >= 3
    d.prof = None
    d._wake.set()
    d._sampling.set()
    t.join(5)
    assert not t.is_alive()
