"""counterprof export RUN --perfetto out.json.gz: the whole run as one timeline.

    counterprof export RUN --perfetto out.json.gz [--window START:END] [--ranks 0,1,4-7]
    counterprof export RUN --perfetto out.pftrace [--window START:END] [--ranks 0,1,4-7]

Every rank's spans (GPU kernels per device and stream, CPU ops per thread, annotations,
regions, steps, collectives, trace windows) and every sample series as counter tracks, on the
run's one clock, in a file ui.perfetto.dev opens. The format goes by FILE's name: .pftrace or
.perfetto-trace (or --format proto) is Perfetto's protobuf trace format, a fraction of the
JSON's bytes with typed counter units (for big runs); any other name (.json, .json.gz) is
Chrome-trace JSON (--format json). Either is gzip'd when the name ends in .gz.

--window keeps what lies in START:END seconds from the run's start (either side may be left
out, not both: 30: or :10), --ranks keeps the ranks listed; both apply to either format. The run
is read and written a batch at a time: memory does not grow with its size (a protobuf trace
holds one rank's spans, encoded, to write them in time order). FILE may not lie inside the run
directory.
"""
from __future__ import annotations

import argparse
import bisect
import os
import re
from pathlib import Path

from .common import ArgumentParser, UsageFailure, err, guarded, open_run
from ..store.run_files import nothing_recorded


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof export", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("run", help="run directory")
    p.add_argument("--perfetto", required=True, metavar="FILE",
                   help="write the timeline to FILE: Perfetto protobuf when FILE ends in .pftrace or "
                        ".perfetto-trace, else Chrome-trace JSON (.json); gzip'd when FILE ends in .gz")
    p.add_argument("--format", choices=("json", "proto"),
                   help="the format whatever FILE's name: json (Chrome-trace JSON) or proto (Perfetto "
                        "protobuf); by default chosen by FILE's name as above")
    p.add_argument("--window", metavar="START:END",
                   help="only what lies in this window, in seconds from the run's start")
    p.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0,1 or 0-3,8")
    return p


def main(argv: list[str]) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS threads: never used here
    return guarded(lambda: _main(argv), reads_runs=True)   # sized to the memory limits first


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DIGITS = re.compile(r"[0-9]+")
MAX_WINDOW_S = 1e9      # ~31 years: beyond it a bound no longer fits the run's int64 ns clock


def parse_window(text: str | None, usage: str) -> tuple[float | None, float | None]:
    """START:END in seconds, either side (not both) left out. Plain decimal numbers only: what
    float() also takes (1_0, inf, nan) is refused."""
    if text is None:
        return None, None
    lo, sep, hi = text.partition(":")
    lo, hi = lo.strip(), hi.strip()
    if not sep or not (lo or hi) or any(v and not _NUMBER.fullmatch(v) for v in (lo, hi)):
        raise UsageFailure(f"--window {text}: expected START:END in seconds, e.g. 10:20, 10: or :20",
                           usage)
    start = float(lo) if lo else None
    end = float(hi) if hi else None
    if any(v is not None and abs(v) > MAX_WINDOW_S for v in (start, end)):
        raise UsageFailure(f"--window {text}: a bound beyond {MAX_WINDOW_S:.0e} seconds is no time in a run",
                           usage)
    if start is not None and end is not None and end <= start:
        raise UsageFailure(f"--window {text}: END must be after START", usage)
    return start, end


Ranks = list[tuple[int, int]]      # --ranks as inclusive (lo, hi) ranges, never expanded


def parse_ranks(text: str | None, usage: str) -> Ranks | None:
    """--ranks 0,1,4-7 -> [(0, 1), (4, 7)]: sorted, overlapping and adjacent ranges joined.
    A range stays two numbers however wide (0-999999999 costs nothing)."""
    if text is None:
        return None
    pairs = []
    for item in text.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not _DIGITS.fullmatch(lo.strip()) or (sep and not _DIGITS.fullmatch(hi.strip())):
            raise UsageFailure(f"--ranks {text}: expected ranks like 0,1 or 0-3,8", usage)
        a = int(lo)
        b = int(hi) if sep else a
        if b < a:
            raise UsageFailure(f"--ranks {text}: {item.strip()} is not a rank or a range of ranks",
                               usage)
        pairs.append((a, b))
    out: Ranks = []
    for a, b in sorted(pairs):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def in_ranks(rank: int, wanted: Ranks) -> bool:
    i = bisect.bisect_right(wanted, (rank, float("inf"))) - 1
    return i >= 0 and wanted[i][0] <= rank <= wanted[i][1]


def not_in_run(wanted: Ranks, have: list[int]) -> Ranks:
    """The parts of the wanted ranges that name no rank of the run (`have`, sorted)."""
    out: Ranks = []
    for a, b in wanted:
        at = a
        for r in have[bisect.bisect_left(have, a):bisect.bisect_right(have, b)]:
            if r > at:
                out.append((at, r - 1))
            at = r + 1
        if at <= b:
            out.append((at, b))
    return out


def real_path(path: Path) -> Path:
    """The path with every symlink resolved (as far as it exists); absolute where a loop of
    symlinks makes that impossible."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def refuse_inside(out: Path, run_dir: Path, usage: str) -> None:
    """--perfetto must not write into the run it reads (it would replace the run's files)."""
    target, run_dir = real_path(out), real_path(run_dir)
    if target == run_dir or run_dir in target.parents:
        raise UsageFailure(f"--perfetto {out} is inside the run directory {run_dir}: writing there "
                           "would replace the run's files; name a file outside it", usage)


_WHAT = {"proto": "Perfetto protobuf", "json": "JSON"}


def _json_name(out: Path) -> bool:
    return out.name.lower().removesuffix(".gz").endswith(".json")


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    usage = parser.format_usage()
    window_s = parse_window(args.window, usage)
    wanted = parse_ranks(args.ranks, usage)

    from ..ground.errors import RunDirectoryError
    from ..export import export_run, trace_format
    from ..store.run_files import list_files
    run = open_run(args.run)
    out = Path(args.perfetto)
    refuse_inside(out, run.path, usage)
    if out.is_dir():
        raise UsageFailure(f"--perfetto {out} is a directory; name a file, e.g. {out}/trace.json.gz", usage)
    named = trace_format(out)
    if args.format and args.format != named and (named == "proto" or _json_name(out)):
        raise UsageFailure(f"--format {args.format} but --perfetto {out} is a {_WHAT[named]} name; "
                           "drop --format or rename the file", usage)
    files = list_files(run.path, run.span)
    if not any(files.values()):
        raise RunDirectoryError(nothing_recorded(run, run.meta, "export"))
    from ..analysis.across_ranks import rank_ranges   # (numpy: loaded after the limits are read)
    ranks = sorted(files)
    if wanted is not None:
        missing = not_in_run(wanted, ranks)
        ranks = [r for r in ranks if in_ranks(r, wanted)]
        if not ranks:
            raise UsageFailure(f"--ranks {args.ranks}: the run has rank(s) {rank_ranges(sorted(files))} only",
                               usage)
        if missing:
            err(f"--ranks: the run has no rank(s) {rank_ranges(missing)}; exporting the others")
    result = export_run(run, files, ranks, out, window_s=window_s, window=args.window,
                        ranks_cut=wanted is not None, fmt=args.format or named)
    for line in result.lines():
        err(line)
    return 0
