"""store/safepath.py: the one way into a run's files never goes through a symbolic link."""
from __future__ import annotations

import os

import pytest

from counterprof.ground.errors import RunDirectoryError
from counterprof.store import meta, rundir, safepath


@pytest.fixture
def named(monkeypatch):
    seen = []
    monkeypatch.setattr(safepath, "_seen", set())
    safepath.set_sink(seen.append)
    yield seen
    safepath.set_sink(None)


def test_listing_skips_and_names_links(tmp_path, named):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "lf").symlink_to(tmp_path / "f")
    (tmp_path / "ld").symlink_to(tmp_path / "d")
    assert safepath.files(tmp_path) == [tmp_path / "f"]
    assert safepath.subdirs(tmp_path) == [tmp_path / "d"]
    assert sorted(named) == sorted(f"{tmp_path / n} is a symbolic link, which counterprof never "
                                   "writes into a run: skipped (not read, not copied, not deleted)"
                                   for n in ("lf", "ld"))
    assert safepath.children(tmp_path / "ld") == []          # a linked folder is not listed


def test_make_dirs_refuses_a_link_on_the_way_and_makes_0700(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    made = safepath.make_dirs(run, run / "a" / "b")
    assert oct(made.stat().st_mode & 0o777) == "0o700" and oct((run / "a").stat().st_mode & 0o777) == "0o700"
    (tmp_path / "victim").mkdir()
    (run / "_ranks").symlink_to(tmp_path / "victim")
    (tmp_path / "victim" / "rank=0").mkdir()
    with pytest.raises(safepath.LinkInRun, match="_ranks is a symbolic link"):
        rundir.rank_dir(run, 0)
    assert os.listdir(tmp_path / "victim" / "rank=0") == []


def test_files_are_opened_and_created_without_following(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    for open_ in (safepath.open_read, safepath.open_lock, safepath.create_new):
        with pytest.raises(safepath.LinkInRun):
            open_(link)
    fd = safepath.create_new(tmp_path / "new")
    os.close(fd)
    assert oct((tmp_path / "new").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(FileExistsError):
        safepath.create_new(tmp_path / "new")
    assert victim.read_text() == "keep"
    with pytest.raises(RunDirectoryError, match="is a symbolic link"):
        meta.load_json(link)


def test_force_deletes_nothing_when_anything_it_would_delete_is_a_link(tmp_path):
    run = rundir.create(tmp_path / "run")
    rundir.write_json(run / rundir.META, {"status": "complete"})
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "weights.bin").write_bytes(b"w")
    part = rundir.dataset_dir(run, "samples", 0)
    (part / "samples-a.parquet").write_bytes(b"ours")
    (part / "deep").mkdir()
    (part / "deep" / "evil").symlink_to(victim)
    with pytest.raises(RunDirectoryError, match="holds symbolic links .*deep/evil.*nothing was replaced"):
        rundir.create(run, replace=True)
    assert (part / "samples-a.parquet").exists() and (victim / "weights.bin").read_bytes() == b"w"
    (part / "deep" / "evil").unlink()
    rundir.create(run, replace=True)
    assert sorted(os.listdir(run)) == [rundir.MARKER] and (victim / "weights.bin").exists()
