"""What the torch driver's step timing costs the workload, outside its traced windows.

Side by side in one process, alternating, medians of several runs:
- a forward call of a small resnet-style model (17 modules) and of a single Linear, with no
  hooks, with two no-op global forward hooks (what any global hook costs: torch's slow path of
  Module.__call__ for every module call) and with the driver installed (its hooks; every
  outermost forward a step, timed and handed to the profiler's schedule);
- an optimizer.step() (the driver's post hook marks a step) against the bare optimizer step;
- next() on a DataLoader iterator over in-memory items (the patched __next__) against torch's own.

    python benchmarks/step_marks.py [--repeat 7] [--calls 2000]

Prints the median time per call and the driver's cost per call (with - without), in µs.
The profiler itself is not measured: the schedule is one recorded step in 10**9, and that
first window is recorded (and its Kineto start-up paid) before the timing starts.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

BOOTSTRAP = Path(__file__).resolve().parents[1] / "collectors" / "torch_trace" / "bootstrap"


def load_driver():
    spec = importlib.util.spec_from_file_location("_counterprof_torch_driver",
                                                  BOOTSTRAP / "_counterprof_torch_driver.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_counterprof_torch_driver"] = mod
    spec.loader.exec_module(mod)
    return mod


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def per_call(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    drv_mod = load_driver()
    run = tempfile.mkdtemp(prefix="counterprof-bench-")

    resnet = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), Block(8), Block(8),
                                 torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()
    linear = torch.nn.Linear(16, 16)
    img, vec = torch.randn(1, 3, 8, 8), torch.randn(4, 16)
    opt = torch.optim.SGD(linear.parameters(), lr=0.0)
    linear(vec).sum().backward()
    loader = torch.utils.data.DataLoader(list(range(10 ** 7)), batch_size=None)

    cases = {
        "forward, resnet-style (17 modules)": lambda: resnet(img),
        "forward, one Linear": lambda: linear(vec),
        "optimizer.step() (SGD, 2 tensors)": opt.step,
    }
    results = {name: ([], []) for name in [*cases, "DataLoader next()"]}
    noop = {name: [] for name in cases if name.startswith("forward")}
    from torch.nn.modules import module as nn_module
    with torch.no_grad():
        for _ in range(args.repeat):
            # the floor: any global forward hook takes torch's slow path for every module call
            hooks = [nn_module.register_module_forward_pre_hook(lambda m, a: None),
                     nn_module.register_module_forward_hook(lambda m, a, o: None, always_call=True)]
            for name in noop:
                noop[name].append(per_call(cases[name], args.calls))
            for h in hooks:
                h.remove()
            for hooked in (False, True):
                drv = None
                if hooked:
                    drv = drv_mod.create(run, every=10 ** 9, active=1, warmup=0, record_shapes=False)
                    for _ in range(8):          # trusted as steps; the first window recorded
                        resnet(img)
                for name, fn in cases.items():
                    if name.startswith("optimizer") and drv is not None:
                        opt.step()              # from here on optimizer steps mark the steps
                    results[name][hooked].append(per_call(fn, args.calls))
                cls = torch.utils.data.dataloader._BaseDataLoaderIter
                patched = cls.__next__
                if not hooked:
                    cls.__next__ = getattr(patched, "__wrapped__", patched)
                it = iter(loader)
                results["DataLoader next()"][hooked].append(per_call(lambda it=it: next(it), args.calls))
                cls.__next__ = patched
                if drv is not None:
                    drv.close()
    print(f"{'per call (µs, median of ' + str(args.repeat) + ')':40s} {'without':>9s} "
          f"{'no-op hooks':>12s} {'driver':>9s} {'cost':>9s}")
    for name, (plain, hooked) in results.items():
        a, b = statistics.median(plain), statistics.median(hooked)
        floor = f"{statistics.median(noop[name]):12.2f}" if name in noop else f"{'':12s}"
        print(f"{name:40s} {a:9.2f} {floor} {b:9.2f} {b - a:+9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
