"""The hostile pass of issues 12 and 30, reproducible: `python tests/hostile/run.py [--quick] [--only CLASS]`.

Not part of the default pytest run (several hundred fresh interpreters: many minutes on a small
machine); tests/integration/test_hostile_*.py run a few cases of each class. Prints one line per
failed case and the count of cases and failures per class; exits 1 when any failed.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import all_cases, pristine, run_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few byte flips per class, not 40")
    ap.add_argument("--only", action="append", help="run only this class (journal, parquet, span, "
                    "meta, catalog, unreadable, import, disk-full; issue 30's race, secrets, output, "
                    "exec, serve, misplaced, range, memory); repeatable")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="cases at once (default 2)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary one)")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="counterprof-hostile-"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)            # the unreadable cases run as nobody inside it
    p = pristine(root / "pristine")
    cases = [c for c in all_cases(p, args.quick) if not args.only or c.klass in args.only]
    total, failed = Counter(), Counter()
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(args.jobs) as pool:
        results = pool.map(lambda ic: (ic[0], run_case(ic[1], root / "cases" / f"{ic[0]:04d}")),
                           enumerate(cases))
        for i, res in results:
            _tally(res, total, failed)
            disk = root / "cases" / f"{i:04d}" / "disk"       # a disk-full case's tmpfs
            if disk.is_dir():
                subprocess.run(["umount", "-l", str(disk)], capture_output=True)
            if not args.keep:
                shutil.rmtree(root / "cases" / f"{i:04d}", ignore_errors=True)
    for klass in total:

        print(f"{klass:<11} {total[klass]:>4} cases, {failed[klass]:>3} failed")
    print(f"{'all':<11} {sum(total.values()):>4} cases, {sum(failed.values()):>3} failed")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


def _tally(res, total: Counter, failed: Counter) -> None:
    case = res.case
    total[case.klass] += 1
    if not res.ok:
        failed[case.klass] += 1
        print(f"FAIL {case.klass}/{case.name} (exit {res.rc}, {res.seconds:.1f} s): "
              + "; ".join(res.problems), flush=True)


if __name__ == "__main__":
    sys.exit(main())
