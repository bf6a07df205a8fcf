"""Text that survives pipes, files and CI logs, with real processes: `report RUN > file` with
no terminal, a region named with escapes and brackets, COLUMNS, NO_COLOR on a real pty, the
nvml hint's brackets in `report` and `list`, the summary on stderr unwrapped."""
from __future__ import annotations

import json
import os
import pty
import re
import subprocess

import pytest

from helpers import COUNTERPROF, PYTHON, run_cli

# a region name that would clear the screen and retitle the window if printed raw
NASTY = "foo[bar]\x1b[2J\x1b]0;PWNED\x07"
SHOWN = "foo[bar]\\x1b[2J\\x1b]0;PWNED\\x07"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
COLOR_SGR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|9[0-7]|38;[0-9;]+)m")

WORKLOAD = f"""
import time, counterprof
for _ in range(3):
    with counterprof.region({NASTY!r}):
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
"""


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR")}
    env.update(kw)
    return env


@pytest.fixture(scope="module")
def nasty_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text")
    script = tmp / "work.py"
    script.write_text(WORKLOAD)
    run = tmp / "run"
    proc = run_cli("run", "-v", "-I", "20", "-o", str(run), "--", PYTHON, str(script), env=_env())
    assert proc.returncode == 0, proc.stderr
    return run, proc


def test_the_summary_on_stderr_is_not_wrapped_and_names_print_inert(nasty_run):
    run, proc = nasty_run
    assert proc.stdout == ""                       # the summary stays on stderr
    assert not CONTROL.search(proc.stderr)
    # the end-of-run line is whole on one line, however long
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("not available here"))
    assert line.endswith("(`counterprof list` says why)"), line
    assert proc.stderr.splitlines()[-1] == f"counterprof: run directory: {run}"


def test_report_to_a_file_keeps_the_regions_table_whole_and_aligned(nasty_run, tmp_path):
    run, _ = nasty_run
    out = tmp_path / "r.txt"
    with open(out, "w") as f:              # stdout a file, no terminal anywhere
        proc = subprocess.run([*COUNTERPROF, "report", str(run)], stdout=f, stderr=subprocess.PIPE,
                              text=True, env=_env(), timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert not CONTROL.search(text), "a control character reached the file"
    assert "\x1b" not in text and "PWNED\x07" not in text
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("region "))
    row = lines[head + 1]
    assert row.startswith(SHOWN + " "), row      # whole name, brackets and escapes visible
    # aligned: each column starts where its header does, on one line (no wrapping at 80)
    for col in ("kind", "count", "time", "verdict", "evidence"):
        at = lines[head].index(col)
        assert row[at - 2:at] == "  " and row[at] != " ", (col, lines[head], row)
    assert max(len(ln) for ln in lines) > 80
    assert lines[head + 2].strip() == ""          # the row did not wrap onto the next line
    assert not [ln for ln in lines if ln.endswith(" ")]      # no padding left at line ends
    # the kernel names, region names and commands in --json are the raw names, as data
    js = json.loads(run_cli("report", str(run), "--json", env=_env(), check=True).stdout)
    assert NASTY in {r["name"] for r in js["regions"]}


def test_columns_is_honoured_in_a_pipe(nasty_run):
    run, _ = nasty_run
    proc = run_cli("report", str(run), env=_env(COLUMNS="70"), check=True)
    assert max(len(ln) for ln in proc.stdout.splitlines()) <= 70
    assert not CONTROL.search(proc.stdout)


def test_the_nvml_hint_keeps_its_brackets_in_report_and_list(nasty_run, tmp_path):
    run, _ = nasty_run
    meta = json.loads((run / "meta.json").read_text())
    hint = "nvidia-ml-py is not installed (`pip install 'counterprof[nvml]'` or `pip install nvidia-ml-py`)"
    meta["collectors"]["nvml"] = {"status": "unavailable", "reason": hint}
    copy = tmp_path / "run"
    subprocess.run(["cp", "-r", str(run), str(copy)], check=True)
    (copy / "meta.json").write_text(json.dumps(meta))
    assert "pip install 'counterprof[nvml]'" in run_cli("report", str(copy), env=_env(), check=True).stdout
    # list, in a process where nvidia-ml-py cannot be imported (Python's own import block)
    code = ("import sys; sys.modules['pynvml'] = None; from counterprof.cli import main; "
            "sys.exit(main(['list']))")
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("nvml"))
    assert "pip install 'counterprof[nvml]'" in line, line


def _on_a_pty(args: list[str], env: dict) -> str:
    """Run with stdout on a real pseudo-terminal; what it printed."""
    master, slave = pty.openpty()
    os.set_inheritable(slave, True)
    proc = subprocess.Popen(args, stdout=slave, stderr=subprocess.DEVNULL, env=env,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:             # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return out.decode("utf-8", "replace")


def test_no_color_on_a_terminal(nasty_run):
    run, _ = nasty_run
    args = [*COUNTERPROF, "report", str(run)]
    coloured = _on_a_pty(args, _env(TERM="xterm-256color", COLUMNS="200"))
    assert COLOR_SGR.search(coloured), "a terminal gets colours (else this test proves nothing)"
    plain = _on_a_pty(args, _env(TERM="xterm-256color", COLUMNS="200", NO_COLOR="1"))
    assert not COLOR_SGR.search(plain)
    assert SHOWN in plain and "\x07" not in plain and "\x1b]0;" not in plain
    assert "\x1b[2J" not in plain


@pytest.mark.parametrize("cmd", [["report"], ["list"]])
def test_json_is_json_on_stdout(nasty_run, cmd):
    run, _ = nasty_run
    args = cmd + ([str(run)] if cmd == ["report"] else []) + ["--json"]
    proc = run_cli(*args, env=_env(), check=True)
    json.loads(proc.stdout)


def test_err_lines_print_inert(tmp_path):
    bad = tmp_path / "no\x1b]0;PWNED\x07run"
    proc = run_cli("report", str(bad), env=_env())
    assert proc.returncode != 0
    assert not CONTROL.search(proc.stderr) and "\\x1b]0;PWNED\\x07" in proc.stderr, proc.stderr


def test_run_json_prints_the_summary_as_one_json_object_on_stdout(tmp_path):
    """`run --json`: the summary as one JSON document on stdout, alone (the workload's stdout
    goes to stderr then), the human text on stderr."""
    proc = run_cli("run", "--json", "-o", str(tmp_path / "r"), "--", PYTHON, "-c", "print('out')")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert "out\n" in proc.stderr and not any(ln.startswith("{") for ln in proc.stderr.splitlines())
    assert s["command"][-1] == "print('out')" and s["exit_status"] == 0
    rows = {r["metric"]: r for r in s["rows"]}
    assert rows["task-clock"]["status"] == "counted" and rows["task-clock"]["value"] > 0
    assert "Performance counter stats" not in proc.stderr          # no table beside it
