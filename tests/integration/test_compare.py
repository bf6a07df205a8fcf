"""`counterprof compare` on real runs: a workload with steps and regions profiled by
`counterprof run`, rerun unchanged, and rerun with each step's sleep made longer (the same
command: the slowdown comes from the environment). Also a real 2-rank gloo job where one rank
sleeps extra per step."""
import json
import os
import subprocess

import pytest

from helpers import COUNTERPROF, PYTHON, REPO, run_cli

WORKLOAD = str(REPO / "tests" / "step_workloads.py")
# 50 steps of a 10 ms spin and a 40 ms sleep: the sleep makes the step time robust to other load
# on this 2-core machine (a wall-clock spin is too); the candidate sleeps 20 ms more (+40%).
STEPS = ("steps", "50", "10", "40")


def profile(path, *args, extra_ms=0, **kw):
    env = dict(os.environ, COUNTERPROF_TEST_EXTRA_MS=str(extra_ms))
    proc = run_cli("run", "-q", "-I", "10", "-o", str(path), "--", PYTHON, WORKLOAD, *args, env=env,
                   timeout=300, **kw)
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    return {"base": profile(d / "base", *STEPS), "rerun": profile(d / "rerun", *STEPS),
            "slow": profile(d / "slow", *STEPS, extra_ms=20), "dir": d}


def compare_json(*args):
    proc = run_cli("compare", *map(str, args), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def rows(j):
    return {(r["key"], r["rank"]): r for r in j["rows"]}


def test_a_slower_step_is_a_regression_and_fails_the_build(runs):
    j = compare_json(runs["base"], runs["slow"])
    r = rows(j)
    step = r[("step_time", None)]
    assert step["status"] == "regression", step
    # +20 ms on a 50 ms step; other load on the machine lengthens both runs' steps, so the
    # measured change is at most 40% (less when the machine is busy) and the step at least 50 ms
    assert 0.1 < step["change"] < 0.5 and step["ci"][0] > 0.03
    assert 0.048 < step["base_median"] < 0.1
    assert r[("region:io", None)]["status"] == "regression"
    assert r[("region:compute", None)]["status"] != "regression"      # the spin did not change
    assert j["regressions"] == 2 and j["settings"]["resamples"] == 2000 and j["settings"]["seed"] == 0
    gate = run_cli("compare", str(runs["base"]), str(runs["slow"]), "--fail-on-regression")
    assert gate.returncode == 1, gate.stderr
    assert "REGRESSION" in gate.stdout and "step time" in gate.stdout
    assert "2 regression(s) flagged" in gate.stderr


def test_an_unchanged_rerun_is_not_flagged(runs):
    gate = run_cli("compare", str(runs["base"]), str(runs["rerun"]), "--fail-on-regression", "--json")
    assert gate.returncode == 0, gate.stderr
    j = json.loads(gate.stdout)
    times = [r for r in j["rows"] if not r["key"].startswith("metric:")]
    assert {r["key"] for r in times} == {"step_time", "wall_time", "region:compute", "region:io"}
    wall = next(r for r in times if r["key"] == "wall_time")
    assert wall["status"] == "too few values" and wall["ci"] is None and wall["n_base"] == 1
    times.remove(wall)
    # unchanged: the whole interval within ±3%; inconclusive: it reaches beyond (a busy machine
    # widens it), but it holds "no change" too: never a regression
    assert all(r["status"] in ("unchanged", "inconclusive") for r in times), times
    assert all(r["ci"][0] <= 0.03 and r["ci"][1] >= -0.03 for r in times)
    # counters may move between runs on a shared machine, but never count as a regression
    assert j["regressions"] == 0
    assert all(r["status"] in ("changed", "unchanged", "inconclusive", "context", "too few values",
                               "no relative change")
               for r in j["rows"] if r["key"].startswith("metric:"))


def test_the_result_is_reproducible_and_the_seed_and_resamples_are_used(runs):
    a = compare_json(runs["base"], runs["slow"])
    b = compare_json(runs["base"], runs["slow"])
    assert a["rows"] == b["rows"]
    c = compare_json(runs["base"], runs["slow"], "--seed", "5", "--resamples", "500")
    assert c["settings"]["seed"] == 5 and c["settings"]["resamples"] == 500
    assert rows(c)[("step_time", None)]["ci"] != rows(a)[("step_time", None)]["ci"]
    assert rows(c)[("step_time", None)]["change"] == rows(a)[("step_time", None)]["change"]


def test_json_and_markdown_shapes(runs):
    j = compare_json(runs["base"], runs["slow"])
    assert set(j) >= {"baseline", "candidate", "settings", "rows", "notes", "regressions", "flagged",
                      "directions"}
    assert j["baseline"]["ids"] == ["base"] and j["candidate"]["paths"] == [str(runs["slow"])]
    assert j["baseline"]["command"][-4:] == list(STEPS)
    for r in j["rows"]:
        assert r["status"] and r["direction"] in ("lower", "either", "context")
        if r["ci"] is not None:
            assert r["ci"][0] <= r["change"] <= r["ci"][1] or r["status"] == "too few values"
    assert {"task-clock", "proc.rss"} <= {r["key"][7:] for r in j["rows"] if r["key"].startswith("metric:")}
    md = run_cli("compare", str(runs["base"]), str(runs["slow"]), "--markdown")
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert lines[0].startswith("### counterprof compare: 2 regressions")
    header = lines.index(next(x for x in lines if x.startswith("| | quantity |")))
    assert lines[header + 1] == "|---|---|---|---|---|---|---|---|"
    table = [x for x in lines[header + 2:] if x.startswith("| ")]
    assert all(x.count(" | ") == 7 for x in table)          # 8 cells in each row ("|" is escaped)
    assert any("**regression**" in x and "`step time`" in x for x in table)
    assert "<details><summary>all" in md.stdout and "</details>" in md.stdout
    assert "- method: median change" in md.stdout


def test_the_verdicts_are_the_reports(runs):
    j = compare_json(runs["base"], runs["slow"])
    for side, name in (("baseline", "base"), ("candidate", "slow")):
        rep = run_cli("report", str(runs[name]), "--json")
        assert rep.returncode == 0, rep.stderr
        o = json.loads(rep.stdout)["overall"]
        word = o["verdict"] if not (o["verdict"] == "unknown" and o["undecided"]) else \
            "unknown (" + "|".join(o["undecided"]) + ")"
        assert j[side]["verdicts"] == [word]
    assert rows(j)[("step_time", None)]["verdict"][0]      # the steps' own verdict, both sides


def test_different_commands_are_refused_unless_forced(runs):
    other = profile(runs["dir"] / "other", "steps", "10", "10", "10")
    proc = run_cli("compare", str(runs["base"]), str(other))
    assert proc.returncode == 2
    assert "ran different commands" in proc.stderr and "--force" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    forced = run_cli("compare", str(runs["base"]), str(other), "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert "--force: the runs ran different commands" in json.loads(forced.stdout)["notes"][0]


def test_sets_of_runs_and_globs(runs):
    d = runs["dir"]
    j = compare_json("--baseline", str(d / "base"), str(d / "rerun"), "--candidate", str(d / "sl*"))
    assert j["baseline"]["ids"] == ["base", "rerun"] and j["candidate"]["ids"] == ["slow"]
    assert rows(j)[("step_time", None)]["status"] == "regression"
    same = compare_json("--baseline", str(d / "base"), "--candidate", str(d / "re*"))
    assert same["regressions"] == 0


def test_usage_errors_exit_2(runs, tmp_path):
    for args in ([str(runs["base"])], [str(runs["base"]), "--baseline", str(runs["base"])],
                 ["--baseline", str(tmp_path / "nothing*"), "--candidate", str(runs["base"])],
                 [str(runs["base"]), str(runs["slow"]), "--threshold", "lots"],
                 [str(runs["base"]), str(runs["slow"]), "--json", "--markdown"]):
        proc = run_cli("compare", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    # what cannot be read is not a regression: 2, so that a CI gate can tell the two apart
    proc = run_cli("compare", str(runs["base"]), str(tmp_path / "missing"), "--fail-on-regression")
    assert proc.returncode == 2 and "no such run directory" in proc.stderr
    proc = run_cli("compare", str(runs["base"]), str(tmp_path), "--fail-on-regression")
    assert proc.returncode == 2 and "not a counterprof run" in proc.stderr


def test_a_candidate_whose_workload_failed_fails_the_gate(runs, tmp_path):
    env = dict(os.environ, COUNTERPROF_TEST_EXTRA_MS="10", COUNTERPROF_TEST_CRASH_AT="3")
    crashed = tmp_path / "crashed"
    proc = run_cli("run", "-q", "-I", "10", "-o", str(crashed), "--", PYTHON, WORKLOAD, *STEPS, env=env,
                   timeout=300)
    assert proc.returncode == 3
    gate = run_cli("compare", str(runs["base"]), str(crashed), "--fail-on-regression")
    assert gate.returncode == 1, gate.stderr
    assert "workload exited with status 3" in gate.stderr
    assert "ran 3 steps per run against the baseline's 50" in gate.stderr
    assert "PROBLEM" in gate.stdout
    j = compare_json(runs["base"], crashed)
    assert j["failed"] is True and j["regressions"] == 0 and len(j["problems"]) == 2
    assert run_cli("compare", str(runs["base"]), str(crashed)).returncode == 0    # no gate: shown only


def test_a_run_named_twice_counts_once(runs):
    j = compare_json("--baseline", runs["base"], str(runs["dir"] / "bas*"), "--candidate", runs["rerun"])
    assert j["baseline"]["paths"] == [str(runs["base"])]


def test_a_killed_profilers_run_is_recovered_first(runs, tmp_path):
    run_dir = tmp_path / "killed"
    env = dict(os.environ, COUNTERPROF_TEST_EXTRA_MS="0")
    proc = subprocess.Popen([*COUNTERPROF, "run", "-q", "-I", "10", "-o", str(run_dir), "--", PYTHON, WORKLOAD,
                             *STEPS], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    from helpers import end_processes, kill_profiler, wait_for_samples
    wait_for_samples(run_dir, rows=20)
    end_processes(kill_profiler(proc))     # the workload too: it wrote its regions journal
    out = run_cli("compare", str(runs["base"]), str(run_dir), "--json")
    assert out.returncode == 0, out.stderr
    assert "recovered" in out.stderr
    assert json.loads((run_dir / "meta.json").read_text())["status"] == "recovered"
    assert any(r["key"] == "metric:task-clock" for r in json.loads(out.stdout)["rows"])


@pytest.mark.slow
def test_a_two_rank_gloo_job_with_a_slow_rank(tmp_path):
    pytest.importorskip("torch")
    base = profile(tmp_path / "base", "gloo", "30", "30")
    slow = profile(tmp_path / "slow", "gloo", "30", "30", extra_ms=15)    # rank 1 sleeps 15 ms more
    proc = run_cli("compare", str(base), str(slow), "--json", "--fail-on-regression")
    assert proc.returncode == 1, proc.stderr
    r = rows(json.loads(proc.stdout))
    assert {k[1] for k in r if k[0] == "step_time"} == {None, 0, 1}
    assert r[("step_time", None)]["status"] == "regression"
    assert r[("step_time", 1)]["status"] == "regression"
    assert r[("region:work", 1)]["status"] == "regression"         # the slow rank's own work
    assert r[("region:work", 0)]["status"] == "unchanged"          # the other rank's is not ...
    assert r[("region:allreduce", 0)]["change"] > 0.5              # ... it waits in the collective
