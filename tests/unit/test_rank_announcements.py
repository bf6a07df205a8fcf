"""Rank announcements (<run>/.ranks/<pid>.json, written by the torch driver): what is taken,
what is ignored with a warning, and that no link is ever followed."""
import json
import os
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from counterprof.collector import Target
from counterprof.ground.proctree import RANK_VARIABLES, rank_of
from counterprof.ranks import (ANNOUNCE_MAX_BYTES, Announcement, RankWatcher, parse_announcement,
                               read_announcements)
from counterprof.session import Session

HOST = socket.gethostname().split(".")[0]


def doc(pid=4242, **kw):
    return {"pid": pid, "rank": 1, "world_size": 2, "local_rank": None, "host": HOST, **kw}


def raw(**kw):
    return json.dumps(doc(**kw)).encode()


def test_a_complete_announcement():
    assert parse_announcement("4242.json", raw(local_rank=1)) == Announcement(4242, 1, 2, 1, HOST)
    assert parse_announcement("4242.json", raw(cuda_device=3)).cuda_device == 3
    assert parse_announcement("4242.json", raw(world_size=None)).world_size is None
    assert parse_announcement("4242.json", raw()).source == "torch.distributed"
    assert parse_announcement("4242.json", raw(source="jax.distributed")).source == "jax.distributed"


@pytest.mark.parametrize("name,data,why", [
    ("4242.json", raw()[:-7], "not complete JSON"),                    # a partial write
    ("4242.json", b"", "not complete JSON"),
    ("4242.json", b"\xff\xfe", "not complete JSON"),
    ("4242.json", b"[1, 2]", "not a JSON object"),
    ("4243.json", raw(), "names pid 4242, but the file is 4243.json"),
    ("x.json", raw(), "not named <pid>.json"),
    ("4242.json", raw(rank=-1), "rank is -1"),
    ("4242.json", raw(rank=True), "rank is True"),
    ("4242.json", raw(rank="1"), "rank is '1'"),
    ("4242.json", raw(rank=2), "rank 2 is not below world_size 2"),
    ("4242.json", raw(host=""), "host is ''"),
    ("4242.json", raw(local_rank=1.5), "local_rank is 1.5"),
    ("4242.json", raw(cuda_device=-1), "cuda_device is -1"),
    ("4242.json", raw(source="mpi"), "source is 'mpi', not one of torch.distributed, jax.distributed"),
])
def test_a_bad_announcement_says_what_is_wrong(name, data, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("[", r"\[")):
        parse_announcement(name, data)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_value_error(data):
    try:
        parse_announcement("7.json", data)
    except ValueError:
        pass


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)   # 2 shared cores
@given(st.dictionaries(st.sampled_from(["pid", "rank", "world_size", "local_rank", "host", "x"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-3, 10**20), st.text(max_size=5),
                                 st.floats(allow_nan=True), st.lists(st.integers(), max_size=2))))
def test_any_json_object_parses_or_raises_value_error(obj):
    try:
        a = parse_announcement(f"{obj.get('pid')}.json", json.dumps(obj).encode())
    except ValueError:
        return
    assert a.rank >= 0 and (a.world_size is None or a.rank < a.world_size)


def test_the_folder_is_read_without_following_links(tmp_path):
    folder = tmp_path / ".ranks"
    folder.mkdir(mode=0o700)
    (folder / "11.json").write_bytes(raw(pid=11))
    (folder / "12.json").write_bytes(raw(pid=12)[:10])                    # partial
    elsewhere = tmp_path / "13.json"
    elsewhere.write_bytes(raw(pid=13))
    os.symlink(elsewhere, folder / "13.json")                             # a link: never followed
    os.mkfifo(folder / "14.json")                                         # would block a plain read
    (folder / "15.json").write_bytes(b" " * (ANNOUNCE_MAX_BYTES + 1))
    (folder / "16.json").write_bytes(raw(pid=16))
    os.utime(folder / "16.json", (1, 1))                                  # a run before this one's
    (folder / "17.json.tmp").write_bytes(raw(pid=17)[:5])                 # being written: not yet
    good, bad = read_announcements(folder, set(), since_ns=time.time_ns() - 60e9)
    assert [(n, a.pid) for n, a in good] == [("11.json", 11)]
    why = dict(bad)
    assert sorted(why) == ["12.json", "13.json", "14.json", "15.json", "16.json"]
    assert why["12.json"].startswith("not complete JSON")
    assert why["13.json"] == "is a symbolic link"
    assert why["14.json"] == "is not a regular file"
    assert why["15.json"] == f"is over {ANNOUNCE_MAX_BYTES} bytes"
    assert why["16.json"] == "was written before this run started"
    # what was taken or refused is not read again
    assert read_announcements(folder, {"11.json", *why}, 0) == ([], [])


def test_a_linked_folder_is_not_read(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "11.json").write_bytes(raw(pid=11))
    os.symlink(real, tmp_path / ".ranks")
    good, bad = read_announcements(tmp_path / ".ranks", set())
    assert good == [] and bad == [(str(tmp_path / ".ranks"), "is a symbolic link: no announcement in it is read")]
    assert read_announcements(tmp_path / "missing", set()) == ([], [])


@pytest.fixture
def session(tmp_path):
    warnings = []
    s = Session(tmp_path / "run", collectors=[], rank=0, on_warning=warnings.append)
    s.start()
    s.said = warnings
    yield s
    s.stop()


def test_the_watcher_takes_a_workload_process_and_warns_about_the_rest(session):
    """This test's process is the tree's root: its announcement is taken, a foreign host's is
    left alone silently, bad ones are named once each in a warning."""
    watcher = RankWatcher(session, [], root=os.getpid())
    folder = session.path / ".ranks"
    assert folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700
    me = os.getpid()
    (folder / f"{me}.json").write_bytes(raw(pid=me, rank=3, world_size=4, local_rank=1))
    (folder / "99.json").write_bytes(raw(pid=99, host="another-node"))
    (folder / "98.json").write_bytes(b'{"pid": 98, "ra')
    os.symlink(folder / f"{me}.json", folder / "97.json")
    watcher.scan()
    watcher.scan()
    assert watcher.ranks[3]["pid"] == me and watcher.ranks[3]["source"] == "torch.distributed"
    assert session.entity_owner == {"gpu:1": 3}
    said = [w for w in session.said if w.startswith("rank announcement")]
    assert len(said) == 2
    assert any("98.json: not complete JSON" in w and w.endswith("ignored") for w in said)
    assert any("97.json: is a symbolic link; ignored" in w for w in said)
    watcher.stop()


def test_a_rank_announced_twice_is_counted_once(session):
    watcher = RankWatcher(session, [], root=os.getpid())
    watcher._found(0, os.getpid(), "environment", 2, None)
    watcher._found(1, os.getpid(), "torch.distributed", 2, None)     # same pid, another rank
    watcher._found(0, 1, "torch.distributed", 2, None)               # same rank, another pid
    assert list(watcher.ranks) == [0]
    assert any("counted as rank 0" in w for w in session.said)
    assert any("two processes with the same rank" in w for w in session.said)


def test_auto_waits_for_a_rank_below_the_root(session):
    """auto: a rank at the root itself (a one-process job calling init_process_group) changes
    nothing: the root's collectors already count it."""
    session.target = Target("launch", os.getpid())
    watcher = RankWatcher(session, [], root=os.getpid(), mode="auto")
    watcher._found(0, os.getpid(), "torch.distributed", 1, None)
    assert watcher.switch is None and watcher.ranks == {}
    assert "rank_switch" not in session.meta


def test_counterprof_rank_wins_over_the_launchers():
    assert RANK_VARIABLES[0] == "COUNTERPROF_RANK"
    assert rank_of({"COUNTERPROF_RANK": "2", "RANK": "0"}) == 2
    assert rank_of({"COUNTERPROF_RANK": "x", "SLURM_PROCID": "5"}) == 5


@pytest.mark.parametrize("argv,mode", [
    (["--", "python", "t.py"], False),
    (["--torch", "--", "python", "t.py"], "auto"),              # ranks may appear: switch then
    (["--torch", "--per-rank", "--", "python", "t.py"], True),
    (["--torch", "--no-per-rank", "--", "python", "t.py"], False),
    (["--torch", "--", "torchrun", "t.py"], True),
    (["--no-per-rank", "--", "torchrun", "t.py"], False),
])
def test_the_per_rank_mode_of_run(argv, mode):
    from counterprof.cli.run import _per_rank_mode, build_parser
    args = build_parser().parse_args(argv)
    assert _per_rank_mode(args, args.command[1:]) == mode


def test_a_rank_inside_another_ranks_tree_is_said(session):
    import subprocess
    child = subprocess.Popen(["sleep", "30"])
    try:
        watcher = RankWatcher(session, [], root=os.getpid())
        watcher._found(0, os.getpid(), "torch.distributed", 2, None)
        watcher._found(1, child.pid, "torch.distributed", 2, None)
        assert sorted(watcher.ranks) == [0, 1]
        assert any(w.startswith("rank 1 runs inside rank 0's process tree") for w in session.said)
    finally:
        child.kill()
        child.wait()


FORK_THEN_EXEC = """
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(float(sys.argv[1]))          # the watcher sees the child before its exec
    os.execve("/bin/sleep", ["sleep", "20"], {"COUNTERPROF_RANK": "3"})
print(pid, flush=True)
os.wait()
"""


def test_a_process_seen_before_its_exec_is_found_after_it(session):
    import subprocess
    import sys
    root = subprocess.Popen([sys.executable, "-c", FORK_THEN_EXEC, "1.0"], stdout=subprocess.PIPE,
                            text=True)
    child = int(root.stdout.readline())
    try:
        watcher = RankWatcher(session, [], root=root.pid)
        watcher.scan()
        assert child in watcher._seen and watcher.ranks == {}     # still the parent's environment
        deadline = time.monotonic() + 10
        while not watcher.ranks and time.monotonic() < deadline:
            time.sleep(0.1)
            watcher.scan()
        assert watcher.ranks[3]["pid"] == child
    finally:
        import signal
        os.kill(child, signal.SIGKILL)      # the root reaps it
        root.wait(timeout=10)
