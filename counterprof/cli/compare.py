"""counterprof compare BASELINE CANDIDATE: did the candidate get slower, and what changed.

    counterprof compare base/ cand/                      step time, regions, metrics; the verdicts
    counterprof compare --baseline 'nightly/a*' --candidate cand1/ cand2/
    counterprof compare base-set/ cand-set/              sets from `run -r N`: N runs per side
    counterprof compare base/ cand/ --fail-on-regression --markdown > comment.md   (CI)

Per quantity: the median's relative change with a bootstrap confidence interval; flagged when
the interval excludes 0 and the change is at least --threshold; unchanged when the whole
interval lies within --threshold; inconclusive otherwise (too wide to call: said, never
failed). A regression that the machine's contention explains (the candidate's main thread
waited for a CPU much longer, and that wait accounts for the change) is said next to its row.
Exit status: 0; 1 with --fail-on-regression when a regression is flagged that contention does
not explain (--strict: any regression) or a run cannot be trusted (its workload failed, the
candidate lost its steps); 2 for everything else that went wrong (usage, runs that cannot be
read, runs of different commands without --force), so that a CI job can tell a slower build
from a broken comparison.
"""
from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

from .common import ArgumentParser, UsageFailure, err, guarded, open_run
from .process_setup import use_system_allocator

FAILED = 1001        # _main's "the gate fails": main() turns it into exit 1


def main(argv: list[str]) -> int:
    use_system_allocator()
    rc = guarded(lambda: _main(argv))
    if rc == FAILED:
        return 1
    return 2 if rc == 1 else rc      # an error is not a regression: keep 1 for the gate


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="counterprof compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", metavar="RUN", help="BASELINE CANDIDATE (two run directories)")
    p.add_argument("--baseline", nargs="+", metavar="RUN", help="baseline runs (directories or globs)")
    p.add_argument("--candidate", nargs="+", metavar="RUN", help="candidate runs (directories or globs)")
    p.add_argument("--threshold", default="3", metavar="PCT",
                   help="smallest change of the median that is flagged, in percent (default 3); a "
                        "change whose whole interval lies within it is unchanged, else inconclusive")
    p.add_argument("--min-time-change-ms", type=float, default=0.1, metavar="MS",
                   help="a region whose median moved by less is not flagged (default 0.1: "
                        "the noise of timing a few-µs region on a shared machine)")
    p.add_argument("--resamples", type=int, default=2000, metavar="N", help="bootstrap resamples (default 2000)")
    p.add_argument("--confidence", type=float, default=0.95, metavar="P",
                   help="confidence level of the intervals (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0): same seed, same result")
    p.add_argument("--window", type=float, metavar="S",
                   help="length of the metric windows in seconds (default: about 200 per run, at least "
                        "2 sampling intervals)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the comparison as JSON")
    out.add_argument("--markdown", action="store_true", help="print a markdown table (pull-request comments)")
    p.add_argument("--all", action="store_true", help="show every row, not only steps, regions and flagged ones")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when a regression is flagged that contention on the machine does not "
                        "explain (CI); inconclusive changes are said, never failed")
    p.add_argument("--strict", action="store_true",
                   help="with --fail-on-regression: fail on every regression, even one that the "
                        "machine's contention explains")
    p.add_argument("--force", action="store_true", help="compare runs of different commands")
    return p


def _threshold(text: str, p: ArgumentParser) -> float:
    from ..analysis.compare_runs import parse_threshold
    try:
        return parse_threshold(text)
    except ValueError as exc:
        raise UsageFailure(str(exc), p.format_usage()) from None


def expand(patterns: list[str], p: ArgumentParser) -> list[str]:
    """Run directories from paths and globs (quoted, so that the shell leaves them to us); a
    run set (`run -r N`) stands for its runs."""
    from ..repeat_set import expand as expand_sets, is_set
    out: list[str] = []
    for pat in patterns:
        if glob.has_magic(pat):
            hits = sorted(h for h in glob.glob(pat) if Path(h, "meta.json").exists() or is_set(h))
            if not hits:
                raise UsageFailure(f"no run directory matches {pat!r}", p.format_usage())
            out.extend(hits)
        else:
            out.append(pat)
    unique, seen = [], set()
    for path in expand_sets(out):      # a run named twice (a glob and its own name) counts once
        key = Path(path).resolve()
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def _main(argv: list[str]) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.baseline or args.candidate:
        if args.runs or not (args.baseline and args.candidate):
            raise UsageFailure("give BASELINE CANDIDATE, or both --baseline RUN... and --candidate RUN...",
                               p.format_usage())
        base_paths, cand_paths = expand(args.baseline, p), expand(args.candidate, p)
    elif len(args.runs) == 2:
        base_paths, cand_paths = expand([args.runs[0]], p), expand([args.runs[1]], p)
    else:
        raise UsageFailure("compare takes two runs: BASELINE CANDIDATE (or --baseline/--candidate)",
                           p.format_usage())
    threshold = _threshold(args.threshold, p)
    if args.resamples < 100:
        raise UsageFailure("--resamples must be at least 100", p.format_usage())
    if not 0.5 <= args.confidence < 1:
        raise UsageFailure("--confidence must be in [0.5, 1)", p.format_usage())
    if not args.min_time_change_ms >= 0:
        raise UsageFailure("--min-time-change-ms must be 0 or more", p.format_usage())
    if args.window is not None and not args.window > 0:
        raise UsageFailure("--window must be positive", p.format_usage())

    from ..analysis.compare_runs import compare_runs, gate_notes
    base_runs = [open_run(x, skip_unreadable=True) for x in base_paths]
    cand_runs = [open_run(x, skip_unreadable=True) for x in cand_paths]
    cmp = compare_runs(base_runs, cand_runs, err, force=args.force, window_s=args.window,
                       threshold=threshold, resamples=args.resamples, confidence=args.confidence,
                       seed=args.seed, min_time_change_s=args.min_time_change_ms / 1000, strict=args.strict)

    from ..render.compare import compare_markdown, compare_text
    from ..render.console import inert_lines
    if args.json:
        json.dump(cmp.to_json(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif args.markdown:
        sys.stdout.write(inert_lines(compare_markdown(cmp)))
    else:
        sys.stdout.write(inert_lines(compare_text(cmp, all_rows=args.all)))
    sys.stdout.flush()
    for problem in cmp.problems:
        err(problem)
    if not args.fail_on_regression:
        return 0
    for note in gate_notes(cmp, args.strict):
        err(note)
    return FAILED if cmp.failed else 0
