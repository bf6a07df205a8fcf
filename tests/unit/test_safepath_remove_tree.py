"""remove_tree_at deletes a tree by descriptor, with shutil.rmtree's dir_fd (3.11+) and with the
walk that stands in for it on 3.10 (whose rmtree has no dir_fd)."""
import os
import types

import pytest

from counterprof.store import safepath


@pytest.mark.parametrize("version", [(3, 10, 0), (3, 11, 0)])
def test_remove_tree_at(tmp_path, monkeypatch, version):
    monkeypatch.setattr(safepath, "sys", types.SimpleNamespace(version_info=version))
    (tmp_path / "run" / "a" / "b").mkdir(parents=True)
    (tmp_path / "run" / "keep").mkdir()
    for p in ("run/x", "run/a/y", "run/a/b/z"):
        (tmp_path / p).write_text("1")
    fd = os.open(tmp_path / "run", os.O_RDONLY)
    try:
        safepath.remove_tree_at(fd, "a")
        safepath.remove_tree_at(fd, "x")
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path / "run")) == ["keep"]
