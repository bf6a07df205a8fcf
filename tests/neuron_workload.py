"""A stand-in for a Neuron application (for the fake neuron-monitor in tests/fake_neuron):
marks itself with FAKE_NEURON_RUNTIME=1 in its environment (how the fake finds "runtimes"),
then for SECONDS moves the fake sysfs counters of its NeuronCores as hardware would.

    python neuron_workload.py SECONDS SYSFS_ROOT FLOPS_PER_TICK [--ranks N]

With --detached it first starts a tagged Neuron application outside its own tree. With
--ranks N it starts N such processes with RANK=r and NEURON_RT_VISIBLE_CORES of their
own (two NeuronCores each) and waits for them. Prints the FLOPs it added per core as JSON.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_neuron import bump


def work(seconds: float, root: str, flops: int) -> dict:
    cores = os.environ.get("NEURON_RT_VISIBLE_CORES", "0-1")
    lo, _, hi = cores.partition("-")
    ids = list(range(int(lo), int(hi or lo) + 1))
    per_device = 4          # as the fake monitor's neuron_hardware_info and the test trees say
    added = {c: 0 for c in ids}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for c in ids:
            if root != "-":
                bump(root, c // per_device, c % per_device, flops=flops, us=10_000)
            added[c] += flops
        time.sleep(0.05)
    return added


def detach(seconds: float) -> int:
    """A Neuron application outside this process tree (double fork: its parent exits), with
    this process's NEURON_PROCESS_TAG and NeuronCores 2-3; its pid."""
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        pid = os.fork()
        if pid:
            os.write(w, str(pid).encode())
            os._exit(0)
        os.execve(sys.executable, [sys.executable, "-c", f"import time; time.sleep({seconds})"],
                  dict(os.environ, FAKE_NEURON_RUNTIME="1", NEURON_RT_VISIBLE_CORES="2-3"))
    os.close(w)
    pid = int(os.read(r, 32))
    os.wait()
    return pid


def main() -> None:
    seconds, root, flops = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    if "--detached" in sys.argv:
        print(f"detached {detach(seconds)}", file=sys.stderr, flush=True)
    if "--ranks" in sys.argv:
        n = int(sys.argv[sys.argv.index("--ranks") + 1])
        procs = []
        for r in range(n):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                       FAKE_NEURON_RUNTIME="1", NEURON_RT_VISIBLE_CORES=f"{2 * r}-{2 * r + 1}")
            procs.append(subprocess.Popen([sys.executable, __file__, str(seconds), root, str(flops)],
                                          env=env, stdout=subprocess.PIPE, text=True))
        added = {}
        for p in procs:
            added.update(json.loads(p.communicate()[0]))
        print(json.dumps(added))
        sys.exit(max(p.returncode for p in procs))
    if os.environ.get("FAKE_NEURON_RUNTIME") != "1":      # re-exec so /proc/PID/environ says so
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, FAKE_NEURON_RUNTIME="1"))
    print(json.dumps(work(seconds, root, flops)))


if __name__ == "__main__":
    main()
