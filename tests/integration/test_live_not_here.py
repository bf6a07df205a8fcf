"""What this machine has not (no NVIDIA driver, no Neuron device, no process for the threads
collector to follow) is one line of the live view and of `counterprof top`, never a panel; the
rows it would have taken go to the workload's output (`run --live`) and to top's process table.
In a real 130x45 terminal (tmux), against the run's own meta.json."""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import time

import pytest

from counterprof.live.figures import short_reason
from helpers import COUNTERPROF, EXAMPLES, PYTHON

if os.environ.get("COUNTERPROF_REQUIRE_TMUX") and shutil.which("tmux") is None:
    raise RuntimeError("COUNTERPROF_REQUIRE_TMUX is set but tmux is not installed")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (Debian: tmux)")]
W, H = 130, 45
_ids = itertools.count()


class Pane:
    def __init__(self, command: str):
        self.socket = f"counterprof-nothere-{os.getpid()}-{next(_ids)}"
        self.env = {k: v for k, v in os.environ.items() if k != "TMUX"} | {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        self.tmux("new-session", "-d", "-s", "t", "-x", str(W), "-y", str(H), command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], env=self.env,
                              capture_output=True, text=True, timeout=30, check=True).stdout

    def screen(self) -> list[str]:
        lines = self.tmux("capture-pane", "-p", "-t", "t").rstrip("\n").split("\n")
        return lines + [""] * (H - len(lines))

    def wait_for(self, predicate, what: str, timeout: float = 40.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.screen()
            if predicate(lines):
                return lines
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(lines))
            time.sleep(0.2)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True)


def unavailable(run) -> dict[str, str]:
    meta = json.loads((run / "meta.json").read_text())
    return {n: c.get("reason", "") for n, c in meta["collectors"].items() if c.get("status") == "unavailable"}


def dashboard_top(lines: list[str]) -> int:
    return next(i for i, ln in enumerate(lines) if ln.startswith("counterprof ▸"))


def check_not_here(lines: list[str], absent: dict[str, str]) -> None:
    """One line names each absent collector with its reason; no panel for any of them."""
    dash = lines[dashboard_top(lines):]
    titles = set(re.findall(r"[╭+]─ (\S+) ", "\n".join(dash)))
    assert not titles & set(absent), titles
    assert not any("│ unavailable" in ln for ln in dash)
    footer = [ln for ln in dash if ln.startswith("not here: ")]
    if not absent:
        assert footer == []
        return
    assert len(footer) == 1 and dash[-1].startswith("not here: "), dash[-3:]
    for name, reason in absent.items():
        assert f"{name} ({short_reason(reason)})" in footer[0], (name, footer[0])


def panel_rows(dash: list[str]) -> int:
    """The rows the panels draw: header lines, bordered rows, the not-here line."""
    return sum(1 for ln in dash if ln.startswith(("counterprof ▸", "bottleneck ", "run ", "not here: ", "╭", "│", "╰"))
               or ln.lstrip().startswith(("│", "╰")))


def test_run_live_gives_the_workload_the_rows_of_what_is_not_here(tmp_path):
    run = tmp_path / "run"
    cmd = shlex.join([*COUNTERPROF, "run", "--live", "-o", str(run), "--",
                      PYTHON, str(EXAMPLES / "phases.py"), "80", "0.1"])
    pane = Pane(f"cd {shlex.quote(str(tmp_path))} && {cmd}; sleep 600")
    try:
        # enough rounds (two lines each) to fill every row the workload has
        lines = pane.wait_for(lambda s: any(ln.startswith("round 30:") for ln in s) and any(
            ln.startswith("╭─ perf") for ln in s), "the dashboard and 60 lines of the workload")
        absent = unavailable(run)
        check_not_here(lines, absent)
        top = dashboard_top(lines)
        dash = lines[top:]
        assert panel_rows(dash) == len(dash)         # nothing but the panels and one line below the workload
        workload = lines[:top]
        # every row of its region holds its output (the last: the cursor, where its next line goes)
        assert all(ln.strip() for ln in workload[:-1]), "a row above the dashboard the workload does not use"
        assert len(workload) == H - len(dash)
        if {"nvml", "neuron"} <= set(absent):
            # their panels took 5-6 rows each (the workload kept ~14 of 45): now one line for both
            assert len(workload) >= 20, len(workload)
    finally:
        pane.kill()


def test_top_lists_processes_in_the_rows_left_and_threads_only_with_a_process(tmp_path):
    run = tmp_path / "kept"
    cmd = shlex.join([*COUNTERPROF, "top", "-o", str(run)])
    pane = Pane(f"cd {shlex.quote(str(tmp_path))} && {cmd}; sleep 600")
    try:
        lines = pane.wait_for(lambda s: any("processes by CPU" in ln for ln in s)
                              and any(ln.startswith("│ system CPU") or "│ system CPU" in ln for ln in s),
                              "top's panels")
        absent = unavailable(run)
        assert "threads" in absent                          # no process to follow without --pid
        check_not_here(lines, absent)
        assert not any("─ threads" in ln for ln in lines)
        start = next(i for i, ln in enumerate(lines) if "processes by CPU" in ln)
        end = next(i for i in range(start + 1, H) if lines[i].startswith("╰"))
        listed = end - start - 2                            # its border and its column heads
        machine = sum(1 for p in os.listdir("/proc") if p.isdigit())
        # every row the panels leave: the table ends where the screen (or the not-here line) does
        assert end == H - 1 - (1 if absent else 0) or listed >= machine - 5, (end, listed, machine)
        assert listed > 10 or machine <= 12                # more than the old fixed 10
        assert panel_rows(lines[dashboard_top(lines):]) == H - dashboard_top(lines)
    finally:
        pane.kill()
