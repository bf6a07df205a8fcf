"""Opening every counter for a target, the way perf stat does.

A target is one or more *units* to count on: the launched child (one counter set,
inherited by its children and threads), each thread of a running process (one set
per tid, from /proc/PID/task), or each CPU (system-wide, -a). Each event group is
opened once per unit; the status of each event (counted, not supported, user space
only) is decided on the first unit and applied to the rest.
"""
from __future__ import annotations

import errno
import os
from collections.abc import Set as AbstractSet
from dataclasses import field

from counterprof.ground.errors import (EventNotSupported, PerfEventError, PerfPermissionError,
                                TargetGone)

from . import native
from .events import PERF_TYPE_SOFTWARE, EventGroup, EventSpec
from counterprof.ground.record import record


@record(frozen=True)
class Unit:
    pid: int        # perf_event_open's pid (-1 for a CPU)
    cpu: int        # perf_event_open's cpu (-1 for a task)
    label: str      # entity when not aggregated: process, tid:123, cpu:3


@record
class OpenedGroup:
    unit: Unit
    leader_fd: int
    fds: list[int]
    events: list[EventSpec]     # the members that opened, leader first


@record
class EventStatus:
    status: str = "counted"     # counted | not supported | not counted | failed
    reason: str = ""
    user_only: bool = False     # fell back to :u because kernel counting was refused
    spec: EventSpec | None = None


@record
class CounterSet:
    groups: list[OpenedGroup] = field(default_factory=list)
    status: dict[str, EventStatus] = field(default_factory=dict)
    units_gone: int = 0          # threads that exited between listing and opening

    def counted_events(self) -> list[EventSpec]:
        return [s.spec for s in self.status.values() if s.status == "counted" and s.spec]

    def close(self) -> None:
        for g in self.groups:
            for fd in reversed(g.fds):
                native.close_fd(fd)
        self.groups.clear()


def task_units(pid: int, exclude: AbstractSet[int] = frozenset(), proc: str = "/proc") -> list[Unit]:
    """One unit per existing thread of `pid`."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc}/{pid}/task"))
    except FileNotFoundError:
        raise TargetGone(f"process {pid} does not exist", errno.ESRCH) from None
    return [Unit(tid, -1, f"tid:{tid}") for tid in tids if tid not in exclude]


def online_cpus(sys_root: str = "/sys") -> list[int]:
    """CPUs listed in /sys/devices/system/cpu/online ('0-3,8-11')."""
    try:
        text = open(f"{sys_root}/devices/system/cpu/online").read().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def cpu_units(sys_root: str = "/sys") -> list[Unit]:
    return [Unit(-1, c, f"cpu:{c}") for c in online_cpus(sys_root)]


class _Opener:
    def __init__(self, enable_on_exec: bool, system_wide: bool):
        self.enable_on_exec = enable_on_exec
        self.system_wide = system_wide
        self.inherit = not system_wide

    def flags(self, leader: bool) -> native.OpenFlags:
        return native.OpenFlags(leader=leader, enable_on_exec=self.enable_on_exec,
                                inherit=self.inherit)

    def open(self, spec: EventSpec, unit: Unit, leader: bool, group_fd: int) -> int:
        return native.open_event(spec, self.flags(leader), unit.pid, unit.cpu, group_fd,
                                 system_wide=self.system_wide)


def pack_software(groups: list[EventGroup]) -> list[EventGroup]:
    """Ungrouped software events, read as one group. Software events are never
    multiplexed, so this changes no count; it turns N reads per tick into one, and each
    read of a running task's counter costs an interrupt (IPI) on the CPU it runs on."""
    sw = [g.leader for g in groups if not g.grouped and g.leader.type == PERF_TYPE_SOFTWARE]
    if len(sw) < 2:
        return groups
    rest = [g for g in groups if g.grouped or g.leader.type != PERF_TYPE_SOFTWARE]
    return [EventGroup(tuple(sw), grouped=False)] + rest


def open_counters(groups: list[EventGroup], units: list[Unit], *, enable_on_exec: bool,
                  system_wide: bool) -> CounterSet:
    """Open every group on every unit. Raises only when nothing at all could be opened
    for a reason the user must fix (permissions, seccomp); unsupported events are
    recorded in the set's status and skipped."""
    opener = _Opener(enable_on_exec, system_wide)
    cs = CounterSet()
    for g in groups:          # status in the order the user listed the events
        for e in g.events:
            cs.status[e.name] = EventStatus(spec=e)
    groups = pack_software(groups)
    decided: set[str] = set()     # events whose status the first unit settled
    permission_errors: list[PerfEventError] = []

    for unit in units:
        for g in groups:
            members = [e for e in g.events if cs.status[e.name].status == "counted"]
            if not members:
                continue
            try:
                opened = _open_group(opener, g, members, unit, cs, decided, permission_errors)
            except TargetGone:
                cs.units_gone += 1
                break          # this thread exited: skip its remaining groups
            if opened is not None:
                cs.groups.append(opened)

    if not cs.groups:
        if permission_errors:
            raise permission_errors[0]
        if not units:
            raise PerfEventError("there is nothing to count: the target has no threads left")
    return cs


def _open_group(opener: _Opener, g: EventGroup, members: list[EventSpec], unit: Unit,
                cs: CounterSet, decided: set[str],
                permission_errors: list[PerfEventError]) -> OpenedGroup | None:
    fds: list[int] = []
    opened: list[EventSpec] = []
    leader_fd = -1
    for spec in members:
        st = cs.status[spec.name]
        effective = st.spec or spec
        is_leader = leader_fd < 0
        try:
            fd = opener.open(effective, unit, is_leader, leader_fd)
        except PerfPermissionError as exc:
            if not effective.modifiers.explicit and not effective.modifiers.exclude_kernel \
                    and spec.name not in decided:
                # perf's fallback: kernel counting refused (paranoid 2) -> count user space only
                try:
                    effective = effective.with_user_only()
                    fd = opener.open(effective, unit, is_leader, leader_fd)
                    st.spec, st.user_only = effective, True
                    st.reason = (f"kernel.perf_event_paranoid forbids kernel counting; "
                                 f"counting user space only ({exc.errno and os.strerror(exc.errno)})")
                except PerfEventError as exc2:
                    _mark(st, spec, exc2, g, cs, decided, is_leader, permission_errors)
                    if is_leader and g.grouped:
                        break
                    continue
            else:
                _mark(st, spec, exc, g, cs, decided, is_leader, permission_errors)
                if is_leader and g.grouped:
                    break
                continue
        except TargetGone:
            for f in reversed(fds):
                native.close_fd(f)
            raise
        except PerfEventError as exc:
            _mark(st, spec, exc, g, cs, decided, is_leader, permission_errors)
            if is_leader and g.grouped:
                break          # the group cannot exist without its leader
            continue
        decided.add(spec.name)
        fds.append(fd)
        opened.append(effective)
        if is_leader:
            leader_fd = fd
    if leader_fd < 0:
        return None
    # Read the group once: a read that fails or returns the wrong shape means the
    # group opened but cannot be counted (perf's "opened but never scheduled" check).
    try:
        words = native.read_group(leader_fd, len(opened))
        if len(words) != len(opened) + 3 or words[0] != len(opened):
            raise PerfEventError(f"group read returned {len(words)} words, expected {len(opened) + 3}")
    except PerfEventError as exc:
        for f in reversed(fds):
            native.close_fd(f)
        for spec in opened:
            st = cs.status[spec.name]
            st.status, st.reason = "failed", f"opened but cannot be read: {exc}"
        return None
    return OpenedGroup(unit, leader_fd, fds, opened)


def _mark(st: EventStatus, spec: EventSpec, exc: PerfEventError, g: EventGroup, cs: CounterSet,
          decided: set[str], is_leader: bool, permission_errors: list[PerfEventError]) -> None:
    if spec.name in decided:
        return   # counted on an earlier unit; a later unit's failure does not change that
    decided.add(spec.name)
    st.status = "not supported" if isinstance(exc, EventNotSupported) else "failed"
    st.reason = str(exc)
    if isinstance(exc, PerfPermissionError):
        permission_errors.append(exc)
    if is_leader and g.grouped:
        for other in g.events[1:]:
            o = cs.status[other.name]
            if o.status == "counted" and other.name not in decided:
                o.status = "not supported"
                o.reason = f"its group leader {spec.name} cannot be counted: {exc}"
                decided.add(other.name)
