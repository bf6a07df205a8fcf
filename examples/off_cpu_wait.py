"""Off-CPU waiting: sleeps and small file writes made durable with fsync.

Expected verdict: host (the process spends most of its time off-CPU, blocked).
Usage: python examples/off_cpu_wait.py [SECONDS]   (default 2.0)
"""
import os
import sys
import tempfile
import time


def wait(seconds: float) -> int:
    end = time.monotonic() + seconds
    writes = 0
    with tempfile.NamedTemporaryFile() as f:
        while time.monotonic() < end:
            time.sleep(0.01)                 # waiting on a timer
            f.write(os.urandom(64 * 1024))   # ... and on the disk
            f.flush()
            os.fsync(f.fileno())
            writes += 1
    return writes


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    print(f"fsynced writes {wait(seconds)}")
