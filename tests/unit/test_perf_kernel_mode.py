"""Kernel sampling's choices that need no kernel: who leads a group, the ring's size, who may try."""
from types import SimpleNamespace

from counterprof.collectors.perf import kernel_mode
from counterprof.collectors.perf.events import parse_events
from counterprof.collector import Target


def specs(text):
    return [e for g in parse_events(text) for e in g.events]


def names(events):
    return [e.name for e in events]


def test_task_clock_leads_a_software_group_wherever_it_was_listed():
    sampled, hidden = kernel_mode._leader_first(specs("page-faults,task-clock,context-switches"))
    assert names(sampled) == ["task-clock", "page-faults", "context-switches"] and not hidden


def test_a_group_without_task_clock_gets_a_hidden_leader():
    sampled, hidden = kernel_mode._leader_first(specs("page-faults,context-switches"))
    assert names(sampled) == ["task-clock", "page-faults", "context-switches"] and hidden


def test_a_hardware_group_keeps_its_order_behind_a_hidden_leader():
    sampled, hidden = kernel_mode._leader_first(specs("cycles,task-clock"))
    assert names(sampled) == ["task-clock", "cycles", "task-clock"] and hidden


def test_the_ring_holds_two_drains_of_samples_within_bounds():
    page = 4096
    small = kernel_mode.ring_pages(100_000_000, 2, 0.5)
    assert small == kernel_mode.MIN_RING_PAGES
    one_ms = kernel_mode.ring_pages(1_000_000, 3, 0.5)
    assert one_ms & (one_ms - 1) == 0
    assert one_ms * page >= 2 * 0.5 * 1000 * (24 + 8 * 6)     # two drains of 1 kHz samples
    assert kernel_mode.ring_pages(100_000, 64, 1.0) == kernel_mode.MAX_RING_PAGES


def test_only_a_launched_command_without_per_thread_may_try():
    def ctx(target):
        return SimpleNamespace(target=target)
    assert kernel_mode.refusal(ctx(Target("launch", 1)), {}) is None
    assert "-a" in kernel_mode.refusal(ctx(Target("launch", 1, system_wide=True)), {})
    assert "attached" in kernel_mode.refusal(ctx(Target("pid", 1)), {})
    assert "--per-thread" in kernel_mode.refusal(ctx(Target("launch", 1)), {"per_thread": True})
