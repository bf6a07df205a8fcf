"""--serve ADDR for `counterprof run` and `counterprof top`: the live window as OpenMetrics
(counterprof/openmetrics.py), bound before anything starts so that a bad or taken address is
one line and exit 2, never a workload profiled without the endpoint it was asked for."""
from __future__ import annotations

from .common import err

TYPE_CHECKING = False      # (typing.TYPE_CHECKING without importing typing at start-up)
if TYPE_CHECKING:
    import argparse

    from ..live.window import LiveWindow
    from ..openmetrics import Exporter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--serve", metavar="[HOST:]PORT",
                   help="serve the live figures as OpenMetrics on http://HOST:PORT/metrics for "
                        "Prometheus (needs the prometheus extra); HOST defaults to 127.0.0.1: "
                        "another address (0.0.0.0) lets other machines read it")


def exporter_for(args: argparse.Namespace, window: LiveWindow | None = None) -> Exporter | None:
    """The Exporter for args.serve, serving already; None without --serve."""
    if not getattr(args, "serve", None):
        return None
    from ..ground.errors import UsageError
    from ..openmetrics import is_loopback, parse_address
    try:
        host, port = parse_address(args.serve)
    except ValueError as exc:
        raise UsageError(f"--serve {exc}") from None
    try:
        from ..openmetrics import Exporter
        exporter = Exporter(host, port, window)
    except ImportError:
        raise UsageError("--serve needs prometheus-client: pip install 'counterprof[prometheus]' "
                         "(or pip install prometheus-client)") from None
    except OSError as exc:
        raise UsageError(f"--serve {args.serve}: cannot listen there: {exc.strerror or exc} "
                         "(choose another port, or a local address)") from None
    err(f"serving OpenMetrics on {exporter.url}")
    if not is_loopback(host):
        err(f"--serve {args.serve} is reachable from other machines: anyone who can connect sees "
            "the command line and its figures (bind 127.0.0.1 to keep it local)")
    return exporter
