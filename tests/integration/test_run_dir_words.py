"""A refused run directory is answered in the caller's own terms: the CLI's -o/--force, the
Python API's path=/replace=True."""
from __future__ import annotations

import pytest

import counterprof
from counterprof.ground.errors import RunDirectoryError
from counterprof.store import rundir
from helpers import run_cli, rank_files


def test_profile_into_a_run_directory_says_path_and_replace(tmp_path):
    run = tmp_path / "run"
    with counterprof.profile(path=run, collectors=["host"]):
        pass
    with pytest.raises(RunDirectoryError) as exc:
        with counterprof.profile(path=run, collectors=["host"]):
            pass
    msg = str(exc.value)
    assert "already holds a run" in msg and "path=" in msg and "replace=True" in msg, msg
    assert "another -o" not in msg and "--force" not in msg, msg
    with counterprof.profile(path=run, collectors=["host"], replace=True):   # what it says works
        pass


def test_the_cli_keeps_its_flags(tmp_path):
    run = tmp_path / "run"
    assert run_cli("run", "-q", "-o", str(run), "--", "true").returncode == 0
    proc = run_cli("run", "-q", "-o", str(run), "--", "true")
    assert proc.returncode == 1
    assert "already holds a run; choose another -o, or pass --force to replace it" in proc.stderr


@pytest.mark.parametrize("words,other,replace", [
    (rundir.CLI_WORDS, "choose another -o", "pass --force"),
    (rundir.API_WORDS, "pass another path=", "pass replace=True"),
])
def test_every_refusal_takes_the_callers_words(tmp_path, words, other, replace):
    held = tmp_path / "held"
    rundir.create(held)
    rundir.write_json(held / rundir.META, {})
    not_dir, foreign = tmp_path / "file", tmp_path / "foreign"
    not_dir.write_text("x")
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    for path, words_expected in ((held, f"{other}, or {replace} to replace it"), (not_dir, other),
                                 (foreign, other)):
        with pytest.raises(RunDirectoryError) as exc:
            rundir.create(path, words=words)
        assert str(exc.value).endswith(words_expected), exc.value
    job = tmp_path / "job"
    rundir.claim(job, job="a", words=words)
    with pytest.raises(RunDirectoryError) as exc:
        rundir.claim(job, job="b", words=words)
    assert f"another job (a); {other}, or set COUNTERPROF_JOB" in str(exc.value)


def test_a_joining_rank_waits_until_the_creator_has_checked_the_directory(tmp_path, monkeypatch):
    """The creator checks the directory for foreign files after it wins the job file; a rank that
    joined earlier and wrote its partition made the creator refuse its own job (seen in CI)."""
    import threading
    run = tmp_path / "run"
    checking, joined = threading.Event(), []
    real_create = rundir.create

    def slow_create(*args, **kwargs):
        checking.set()
        import time
        time.sleep(0.3)                      # a joiner that did not wait would write meanwhile
        return real_create(*args, **kwargs)

    monkeypatch.setattr(rundir, "create", slow_create)

    def joiner():
        checking.wait(5)
        path, was_joined = rundir.claim(run, job="j")
        rundir.rank_dir(path, 1)             # what a joined rank writes first
        joined.append(was_joined)

    t = threading.Thread(target=joiner)
    t.start()
    assert rundir.claim(run, job="j") == (run, False)
    t.join(10)
    assert joined == [True]
    assert rank_files(run, 1).is_dir()


def test_a_joiner_finds_a_run_however_slowly_the_creator_starts(tmp_path):
    """The first rank's profile() writes the run's meta.json before the job's other ranks are let
    in: a joiner's profile() read the run before a loaded creator had written it (seen in CI:
    "is not a counterprof run (no meta.json)" in rank 0 of a torchrun job)."""
    import threading
    import time
    from counterprof.store.reader import Run
    run = tmp_path / "run"
    creating, seen = threading.Event(), []

    def first_meta(path):
        creating.set()
        time.sleep(0.3)                     # a creator slowed by the machine's load
        rundir.write_json(path / rundir.META, {"id": path.name, "status": "running"})

    def joiner():
        creating.wait(5)
        path, was_joined = rundir.claim(run, job="j", on_create=first_meta)
        Run(path)                           # what profile() opens as soon as it has joined
        seen.append(was_joined)

    t = threading.Thread(target=joiner)
    t.start()
    assert rundir.claim(run, job="j", on_create=first_meta) == (run, False)
    t.join(10)
    assert seen == [True]


def test_a_refused_creator_leaves_nothing_to_join(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("x")
    for _process in range(2):     # every process of the job gets the refusal itself
        with pytest.raises(RunDirectoryError, match="not empty and is not a run directory; pass another path="):
            rundir.claim(run, job="j", words=rundir.API_WORDS)
    assert not (run / rundir.JOB).exists()


def test_a_finished_run_of_another_job_is_replaced_only_when_asked(tmp_path):
    """A rerun of a torchrun job has a new job id (TORCHELASTIC_RUN_ID): replace=True replaces
    the finished run; without it the refusal says how."""
    run = tmp_path / "run"
    with counterprof.profile(path=run, collectors=["host"], job="first"):
        pass
    assert (run / rundir.JOB).read_text().strip() == "first"
    with pytest.raises(RunDirectoryError) as exc:
        rundir.claim(run, job="second", words=rundir.API_WORDS)
    assert "another job (first)" in str(exc.value) and str(exc.value).endswith("pass replace=True to replace it")
    assert rundir.claim(run, job="second", replace=True, words=rundir.API_WORDS) == (run, False)
    assert (run / rundir.JOB).read_text().strip() == "second"
    assert not (run / rundir.META).exists()
    assert rundir.claim(run, job="second", replace=True) == (run, True)    # its other ranks join
    # a plain replace (counterprof run --force) leaves no job file to confuse a later job
    rundir.write_json(run / rundir.META, {"status": "complete"})
    rundir.create(run, replace=True)
    assert not (run / rundir.JOB).exists()
