"""git_revision() against the git tool itself, on real repositories: a branch, a detached HEAD,
packed refs, a worktree, and outside any checkout."""
import shutil
import subprocess

import pytest

from counterprof.ground.gitrev import git_revision

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "t@example.com")
    git(r, "config", "user.name", "t")
    (r / "a").write_text("1")
    git(r, "add", "a")
    git(r, "commit", "-q", "-m", "one")
    return r


def test_branch_subdirectory_and_outside(repo, tmp_path):
    (repo / "sub").mkdir()
    assert git_revision(repo / "sub") == git(repo, "rev-parse", "HEAD")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert git_revision(outside) is None or git_revision(outside) == git(outside, "rev-parse", "HEAD")


def test_packed_refs_detached_head_and_worktree(repo, tmp_path):
    first = git(repo, "rev-parse", "HEAD")
    (repo / "a").write_text("2")
    git(repo, "commit", "-q", "-am", "two")
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert git_revision(repo) == git(repo, "rev-parse", "HEAD") != first
    git(repo, "checkout", "-q", first)
    assert git_revision(repo) == first
    git(repo, "checkout", "-q", "main")
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "side", str(wt), first)
    assert git_revision(wt) == first == git(wt, "rev-parse", "HEAD")


def test_a_run_records_the_revision_it_started_from(repo, tmp_path, monkeypatch):
    import counterprof
    monkeypatch.chdir(repo)
    with counterprof.profile(collectors=["host"], path=tmp_path / "r") as run:
        pass
    assert run.meta["git_revision"] == git(repo, "rev-parse", "HEAD")
