"""errors.os_error: the one line an OSError becomes, naming the file and what was being done."""
from __future__ import annotations

import errno

from counterprof.ground.errors import DiskFull, RunDirectoryError, os_error


def test_an_unexpected_error_names_what_was_being_done():
    e = os_error(OSError(errno.EFBIG, "File too large"), "/runs/r", "importing the traces")
    assert isinstance(e, RunDirectoryError)
    assert str(e) == "/runs/r: importing the traces failed: File too large (EFBIG)"


def test_the_default_doing_reads_as_a_sentence():
    e = os_error(OSError(errno.ESPIPE, "Illegal seek", "/tmp/p"))
    assert str(e) == "/tmp/p: using it failed: Illegal seek (ESPIPE)"


def test_a_full_disk_says_what_was_kept():
    e = os_error(OSError(errno.ENOSPC, "No space left on device"), "/nonexistent/r/meta.json",
                 "writing meta.json", kept="the spans")
    assert isinstance(e, DiskFull)
    assert "no space left on the device (writing meta.json, ENOSPC); kept the spans" in str(e)
