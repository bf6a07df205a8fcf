"""`counterprof run --live` and `counterprof top` as a user sees them: in a real terminal
(tmux, read back with capture-pane), and with stderr piped."""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import COUNTERPROF, EXAMPLES, PYTHON, table_files, journal_dir

# the classifier's verdicts, as the bottleneck line starts with them
VERDICTS = ("compute-bound", "memory-bound", "collectives-bound", "host-bound", "unknown")

# CI installs tmux and sets this: there, a missing tmux fails instead of skipping.
if os.environ.get("COUNTERPROF_REQUIRE_TMUX") and shutil.which("tmux") is None:
    raise RuntimeError("COUNTERPROF_REQUIRE_TMUX is set but tmux is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None,
                       reason="tmux is not installed (Debian: tmux; .ci/run installs it)"),
]
_ids = itertools.count()


class Tmux:
    """One tmux server of our own (-L), one window running `command` in a shell."""

    def __init__(self, width: int = 120, height: int = 40):
        self.socket = f"counterprof-test-{os.getpid()}-{next(_ids)}"
        self.width, self.height = width, height
        self.env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        self.env.pop("TMUX", None)

    def tmux(self, *args: str, check: bool = True) -> str:
        p = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if check and p.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {p.stderr}")
        return p.stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", "t", "-x", str(self.width), "-y", str(self.height), command)

    def screen(self, history: bool = False) -> list[str]:
        args = ["capture-pane", "-p", "-t", "t"] + (["-S", "-"] if history else [])
        return self.tmux(*args).rstrip("\n").split("\n")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def resize(self, width: int, height: int) -> None:
        self.tmux("resize-window", "-t", "t", "-x", str(width), "-y", str(height))

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "") -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.screen()
            if predicate(lines):
                return lines
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n" + "\n".join(lines))
            time.sleep(0.1)

    def kill(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.fixture
def term():
    t = Tmux()
    yield t
    t.kill()


def shell(cmd: list[str], tmp_path: Path, env: str = "") -> str:
    """A pane command: run cmd, then record its exit status and the terminal's modes."""
    return (f"cd {shlex.quote(str(tmp_path))} && {env} {shlex.join(cmd)}; echo EXIT=$?; "
            f"stty -a > stty.txt; sleep 600")


def has(text: str):
    return lambda lines: any(text in ln for ln in lines)


def row(lines: list[str], label: str) -> str:
    return next(ln for ln in lines if ln.startswith(f"│ {label}"))


def header_elapsed(lines: list[str]) -> str:
    head = next(ln for ln in lines if ln.startswith("counterprof ▸"))
    return re.search(r"(\d+:\d\d)\s+q ", head).group(1)


def terminal_restored(tmp_path: Path) -> None:
    modes = (tmp_path / "stty.txt").read_text().split()
    assert "icanon" in modes and "echo" in modes, modes


def meta_of(run: Path) -> dict:
    return json.loads((run / "meta.json").read_text())


def test_dashboard_updates_q_stops_profiling_and_the_workload_finishes(term, tmp_path):
    run = tmp_path / "run"
    term.start(shell([*COUNTERPROF, "run", "--live", "-o", str(run), "--",
                      PYTHON, str(EXAMPLES / "phases.py"), "6", "0.75"], tmp_path))
    first = term.wait_for(lambda s: has("╭─ perf")(s) and has("╭─ host")(s) and has("│ RSS")(s)
                          and has("round 0: computed")(s), what="the dashboard and the workload's output")
    # the workload's output sits above the dashboard, the dashboard at the bottom
    out_row = next(i for i, ln in enumerate(first) if "round 0: computed" in ln)
    head_row = next(i for i, ln in enumerate(first) if ln.startswith("counterprof ▸"))
    assert out_row < head_row
    # the last row: a panel's border, or the one line naming what this machine has not
    assert (first[-1].rstrip().endswith("╯") or first[-1].startswith("not here: ")) \
        and first[head_row + 1].startswith("bottleneck ")
    assert first[head_row + 2] == f"run {run}"
    assert row(first, "CPU utilization").split()[4] == "CPUs"
    # values move: the clock, and the CPU row's value or sparkline
    later = term.wait_for(lambda s: has("╭─ perf")(s) and header_elapsed(s) != header_elapsed(first)
                          and row(s, "CPU utilization") != row(first, "CPU utilization"),
                          timeout=10, what="the dashboard to update")
    assert has("╭─ host")(later)
    verdicts = {next(ln for ln in term.screen() if ln.startswith("bottleneck "))}
    term.keys("q")
    stopped = term.wait_for(has("profiling stopped (q)"), timeout=20, what="q to stop profiling")
    assert not has("╭─ perf")(stopped)             # the dashboard is gone, the terminal is whole
    meta = meta_of(run)
    assert meta["status"] == "complete"
    assert meta["workload"]["status"] == "running when profiling stopped"
    assert table_files(run, "samples", 0)
    assert not list(journal_dir(run, 0).glob("*"))
    # the workload runs to its end and counterprof returns its status
    term.wait_for(has("EXIT=0"), timeout=30, what="the workload to finish")
    assert has("done")(term.screen(history=True))   # above the summary, which may scroll it off
    meta = meta_of(run)
    assert meta["workload_exit"]["exit_status"] == 0 and meta["workload_exit"]["status"] == "exited"
    terminal_restored(tmp_path)
    # every line the workload printed is there, in order (scrollback included)
    everything = "\n".join(term.screen(history=True))
    expected = [f"round {i}: {w}" for i in range(6) for w in ("computed", "slept")] + ["done"]
    positions = [everything.find(x) for x in expected]
    assert -1 not in positions and positions == sorted(positions), everything
    assert verdicts and all(v.split()[1].startswith(VERDICTS) for v in verdicts)


def test_ctrl_c_goes_to_the_workload_and_the_terminal_is_restored(term, tmp_path):
    run = tmp_path / "run"
    term.start(shell([*COUNTERPROF, "run", "--live", "-o", str(run), "--",
                      PYTHON, str(EXAMPLES / "phases.py"), "60", "0.5"], tmp_path))
    term.wait_for(has("╭─ perf"), what="the dashboard")
    term.keys("C-c")
    lines = term.wait_for(has("EXIT="), timeout=30, what="the run to end")
    # the traceback sits above the summary, which may scroll it off the screen
    assert has("EXIT=130")(lines) and has("KeyboardInterrupt")(term.screen(history=True))
    assert not has("╭─ perf")(lines)
    meta = meta_of(run)
    assert meta["status"] == "complete" and meta["workload"]["exit_status"] == 130
    assert meta["workload"]["forwarded_signals"] == []        # the terminal's Ctrl-C, not sent twice
    terminal_restored(tmp_path)


def test_resize_relays_out_and_small_terminals_get_the_compact_view(term, tmp_path):
    run = tmp_path / "run"
    term.start(shell([*COUNTERPROF, "run", "--live", "-o", str(run), "--",
                      PYTHON, str(EXAMPLES / "phases.py"), "60", "0.5"], tmp_path))
    term.wait_for(has("╭─ perf"), what="the dashboard")
    term.resize(70, 12)
    small = term.wait_for(lambda s: not has("╭─")(s) and has("counterprof 0:")(s), timeout=10,
                          what="the compact view")
    i = next(i for i, ln in enumerate(small) if ln.startswith("counterprof 0:"))
    assert small[i + 1].startswith("task-clock ") and small[i + 2].startswith(VERDICTS)
    assert i + 3 == len(small) or all(not ln.strip() for ln in small[i + 3:])
    term.resize(30, 5)
    term.wait_for(lambda s: len(s) == 5 and any(re.match(r"^\d+:\d\d ", ln) for ln in s), timeout=10,
                  what="the one-line view")
    term.resize(130, 45)
    big = term.wait_for(lambda s: has("╭─ perf")(s) and has("╭─ host")(s), timeout=10,
                        what="the full view again")
    assert all(len(ln) <= 130 for ln in big)
    term.keys("q")
    term.wait_for(has("profiling stopped (q)"), timeout=20, what="q to stop profiling")
    term.keys("C-c")                  # after q the workload still has the terminal's Ctrl-C
    term.wait_for(has("EXIT=130"), timeout=20, what="the workload to end")
    terminal_restored(tmp_path)
    meta = meta_of(run)
    assert meta["status"] == "complete" and meta["workload_exit"]["exit_status"] == 130


def test_top_shows_the_machine_and_q_quits_leaving_nothing(term, tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    term.start(shell([*COUNTERPROF, "top"], tmp_path, env=f"TMPDIR={shlex.quote(str(tmpdir))}"))
    lines = term.wait_for(lambda s: has("processes by CPU")(s) and has("│ system CPU")(s),
                          what="top's panels")
    assert lines[next(i for i, ln in enumerate(lines) if ln.startswith("counterprof ▸"))].startswith(
        "counterprof ▸ this machine")
    assert has(f" of {os.cpu_count()} CPUs busy")(lines)
    assert not has("│ CPU utilization")(lines)                # -a's task-clock is no busy figure
    term.keys("q")
    term.wait_for(has("EXIT=0"), timeout=20, what="top to quit")
    terminal_restored(tmp_path)
    assert list(tmpdir.iterdir()) == []


def test_top_pid_attaches_to_a_running_process(term, tmp_path):
    burner = subprocess.Popen([PYTHON, str(EXAMPLES / "busy.py"), "60"], stdout=subprocess.DEVNULL)
    try:
        term.start(shell([*COUNTERPROF, "top", "--pid", str(burner.pid), "-o", "kept"], tmp_path))
        lines = term.wait_for(lambda s: has("│ CPU utilization")(s) and has("│ RSS")(s)
                              and row(s, "CPU utilization").split()[3] != "—",
                              what="the process's panels")
        assert has(f"counterprof ▸ pid {burner.pid} (python")(lines)
        assert float(row(lines, "CPU utilization").split()[3]) > 0.2
        term.keys("q")
        term.wait_for(has("EXIT=0"), timeout=20, what="top to quit")
        assert meta_of(tmp_path / "kept")["stopped_because"] == "stopped from the live view (q)"
        assert burner.poll() is None                            # attaching changes nothing for it
    finally:
        burner.kill()
        burner.wait()


def test_not_a_terminal_prints_a_line_per_interval(tmp_path):
    run = tmp_path / "run"
    p = subprocess.run([*COUNTERPROF, "run", "--live", "-o", str(run), "--",
                        PYTHON, str(EXAMPLES / "busy.py"), "3.5"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"iterations \d+\n", p.stdout)            # stdout is the workload's alone
    lines = [ln for ln in p.stderr.splitlines()
             if re.match(r"counterprof: +\d+\.\d{3} s  task-clock \d+\.\d\d CPUs  ", ln)]
    assert len(lines) >= 3, p.stderr
    assert all(" | " in ln for ln in lines)
    assert "\x1b" not in p.stderr                                  # no escape sequences in a log
    times = [float(ln.split()[1]) for ln in lines]
    # one line a second on a fixed grid: a late wake-up (a loaded machine) shortens the next gap
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(0.5 < g < 1.5 for g in gaps), times
    assert (times[-1] - times[0]) / len(gaps) == pytest.approx(1.0, abs=0.15), times
    assert meta_of(run)["status"] == "complete"


def test_top_not_a_terminal(tmp_path):
    p = subprocess.run([*COUNTERPROF, "top", "--duration", "2.5"], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if re.match(r"counterprof: +\d+\.\d{3} s ", ln)]
    assert len(lines) >= 2 and all(f"of {os.cpu_count()} CPUs busy" in ln for ln in lines[1:]), p.stderr
    assert list(tmp_path.iterdir()) == []


def test_top_usage_errors():
    p = subprocess.run([*COUNTERPROF, "top", "--pid", "999999999"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no process with pid 999999999" in p.stderr
    assert "Traceback" not in p.stderr


PYTHON_IN_STEP = """
import time, torch, counterprof
torch.set_num_threads(1)          # one thread: a loaded 2-core machine's spin-waits stay out of it
a = torch.randn(128, 128)
t_end = time.monotonic() + float(__import__("sys").argv[1])
python_s = loop_s = 0.0
while time.monotonic() < t_end:
    t0 = time.perf_counter()
    ids = [hash(str(i)) % 2048 for i in range(40000)]       # the step's Python: 2/3 of it
    t1 = time.perf_counter()
    for _ in range(2):
        a = torch.tanh(a @ a)
    counterprof.step()
    python_s += t1 - t0
    loop_s += time.perf_counter() - t0
print(f"python {python_s / loop_s:.3f}")
"""


def test_live_line_says_python_outside_torch_ops_once_a_trace_is_in(tmp_path):
    """With --torch, the live line shares the main thread's on-CPU time as the report does:
    the newest trace window's time outside torch ops is host (live/traces.py, live/verdict.py)."""
    pytest.importorskip("torch")
    job = tmp_path / "job.py"
    job.write_text(PYTHON_IN_STEP)
    run = tmp_path / "run"
    p = subprocess.run([*COUNTERPROF, "run", "--live", "--torch", "-o", str(run), "--", PYTHON, str(job), "6"],
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    truth = float(re.search(r"python (\d\.\d+)", p.stdout).group(1))
    said = [float(m.group(1)) / 100 for m in re.finditer(r"on-CPU outside torch ops (\d+)% of the time", p.stderr)]
    assert said, p.stderr[-3000:]
    # the main thread's Python is most of each step by the job's own clock; the live figure is
    # a share of the wall time (waiting for a CPU apart): at most the job's, and most of it
    # when the machine is quiet
    assert truth >= 0.5, truth
    assert said[-1] <= truth + 0.15, (said, truth)
    rep = json.loads(subprocess.run([*COUNTERPROF, "report", str(run), "--json"], capture_output=True,
                                    text=True, timeout=120).stdout)
    parts = rep["overall"]["host_parts"]
    assert parts.get("Python outside torch ops", 0.0) > 0, parts
