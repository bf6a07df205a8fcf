"""counterprof.perf_warmup: the open-and-close `counterprof run` starts on a thread as it
begins (the kernel's first-perf-event wait overlapped with the imports). It opens a real
counter and leaves nothing open, falls back to user space as the collector does, and ends
quietly where there is no native core. Its speed-up is a benchmark's
(benchmarks/first_perf_event.py), not a test's."""
import os
import shutil
import subprocess
import sys

import pytest

from counterprof import perf_warmup
from counterprof.ground.errors import perf_event_paranoid
from helpers import PYTHON


def _perf_fds() -> set[str]:
    """This process's perf event descriptors (other threads' files may come and go meanwhile)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[perf_event]":
                found.add(fd)
        except OSError:
            continue
    return found


def test_it_opens_a_counter_and_leaves_no_descriptor():
    before = _perf_fds()
    thread = perf_warmup.warm_up()
    assert thread.daemon and thread.name == "cp-perf-warmup"
    thread.join(10)
    assert not thread.is_alive()
    assert _perf_fds() == before
    assert perf_warmup.open_and_close() == ("all" if os.geteuid() == 0 or (perf_event_paranoid() or 0) < 2
                                            else "user space")


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
@pytest.mark.skipif((perf_event_paranoid() or 0) < 2,
                    reason="perf_event_paranoid < 2: an unprivileged user may count the kernel too")
def test_unprivileged_it_opens_a_user_space_counter():
    p = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", PYTHON, "-c",
                        "from counterprof.perf_warmup import open_and_close; print(open_and_close())"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "user space"


def test_without_the_native_core_it_ends_quietly(monkeypatch):
    monkeypatch.setitem(sys.modules, "counterprof._native", None)
    assert perf_warmup.open_and_close() == "no native core"
