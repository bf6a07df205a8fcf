"""`counterprof run --neuron-profile`: the Neuron runtime's own capture, turned on for the
workload, processed and imported when it ends.

Before the workload starts: NEURON_RT_INSPECT_ENABLE=1, NEURON_RT_INSPECT_DEVICE_PROFILE (model:
the first execution of each NEFF on each core; session: all of them), NEURON_RT_INSPECT_SYSTEM_
PROFILE=1 and NEURON_RT_INSPECT_OUTPUT_DIR=<run>/neuron_profile/raw, as Neuron's environment
variable reference documents them. When it has ended: `neuron-explorer view -d RAW
--output-file <run>/neuron_profile/parquet` when neuron-explorer is on PATH, and every profile
directory it wrote read by explorer.py into the run's spans and samples (as `counterprof import
--into` would). Without neuron-explorer the raw files stay in the run and the one command that
finishes the job is said.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from counterprof.collector import Collector, SessionContext

from .capture_options import NeuronProfileOptions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .explorer import Profile

EXPLORER = "neuron-explorer"
PROCESS_TIMEOUT_S = 1800.0


def finish_command(run: Path) -> str:
    raw, out = run / "neuron_profile" / "raw", run / "neuron_profile" / "parquet"
    return (f"{EXPLORER} view -d {raw} --output-file {out} && counterprof import {out} --into {run}")


class NeuronProfileCollector(Collector):
    name = "neuron_profile"
    default_on = False
    options = NeuronProfileOptions
    DEFAULTS = {"mode": "model"}

    def launch_environment(self, run_path: Path) -> dict[str, str]:
        self.raw = run_path / "neuron_profile" / "raw"
        self.raw.mkdir(parents=True, exist_ok=True, mode=0o700)
        return {"NEURON_RT_INSPECT_ENABLE": "1", "NEURON_RT_INSPECT_SYSTEM_PROFILE": "1",
                "NEURON_RT_INSPECT_DEVICE_PROFILE": "1" if self.config["mode"] == "model" else "session",
                "NEURON_RT_INSPECT_OUTPUT_DIR": str(self.raw)}

    def start(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.details["mode"] = self.config["mode"]

    def stop(self) -> None:
        if not hasattr(self, "ctx") or self.details.get("done"):
            return
        self.details["done"] = True
        run = self.ctx.run_path
        raw = getattr(self, "raw", None)
        if run is None or raw is None:
            return
        files = sorted(p.name for p in raw.rglob("*") if p.is_file())
        self.details["raw_files"] = len(files)
        if not files:
            self.status = "empty"
            self.reason = (f"the workload wrote no Neuron profile to {raw}: it ran no NEFF on a NeuronCore (no Neuron "
                           "runtime here, or it ended before its first execution)")
            return
        import shutil
        import subprocess
        exe = shutil.which(EXPLORER)
        if exe is None:
            self.status = "empty"
            self.reason = (f"{EXPLORER} is not on PATH: the raw profile is kept in {raw}; to process and import it: "
                           f"{finish_command(run)}")
            self.ctx.warn(f"neuron_profile: {self.reason}")
            return
        out = run / "neuron_profile" / "parquet"
        try:
            done = subprocess.run([exe, "view", "-d", str(raw), "--output-file", str(out)], capture_output=True,
                                  text=True, timeout=PROCESS_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._failed(f"{EXPLORER} could not process the profile ({exc}); the raw files are kept: "
                         f"{finish_command(run)}")
            return
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            self._failed(f"{EXPLORER} failed: {why[0][:300]}; the raw files are kept in {raw}")
            return
        from . import explorer          # (pyarrow: loaded once there is a profile to read)
        from .profile_dirs import find_profiles
        dirs, _ = find_profiles([out])
        if not dirs:
            self._failed(f"{EXPLORER} wrote no profile directory under {out}; the raw files are kept in {raw}")
            return
        self._emit([explorer.read_profile(d) for d in dirs])

    def _emit(self, profiles: list[Profile]) -> None:
        from . import explorer
        cores = sorted({(p.device, p.core) for p in profiles})
        self.ctx.add_metrics(explorer.METRICS)
        for p in profiles:
            rank = self.ctx.rank + (cores.index((p.device, p.core)) if len(cores) > 1 else 0)
            for batch in p.spans.to_batches(max_chunksize=65536):
                self.ctx.emit("spans", batch, rank)
            for batch in p.samples.to_batches():
                self.ctx.emit("samples", batch, rank)
            for problem in p.problems:
                self.ctx.warn(f"neuron_profile: {p.path.name}: {problem}")
        self.details["profiles"] = [{"path": str(p.path), "schema_version": p.version,
                                     "neuroncore": f"neuron:{p.device}/core:{p.core}",
                                     "alignment": p.alignment.to_json(), "counts": p.counts} for p in profiles]

    def _failed(self, reason: str) -> None:
        self.status, self.reason = "failed", reason
        self.ctx.fail(self.name, reason)

    def summary_config(self) -> dict[str, Any]:
        import shutil         # (here, not at import: every run loads the collector classes)
        return {**self.config, "explorer": shutil.which(EXPLORER)}


__all__ = ["NeuronProfileCollector"]
