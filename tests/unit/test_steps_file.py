"""The torch driver's steps files -> step and input spans: complete lines only, read on from
where the last read stopped, the process's pid and each mark's thread."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from counterprof.collectors.torch_trace.steps import StepsFile, steps_file_of_trace

T0 = 1_800_000_000_000_000_000


def test_complete_lines_are_read_once_and_a_cut_line_waits_for_its_end(tmp_path):
    traces = tmp_path / "run" / "rank=2" / "traces"
    traces.mkdir(parents=True)
    path = traces / "host_4242.steps"
    path.write_text("counterprof-steps 1\tpid=4242\thost=host\nmarks\toptimizer\n"
                    f"step\t{T0}\t{T0 + 10}\t4243\tProfilerStep#0\n"
                    f"input\t{T0 + 10}\t{T0 + 15}\t4243\tenumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__\n"
                    f"step\t{T0 + 10}\t" + str(T0 + 20)[:-1])    # the writer is mid-line
    sf = StepsFile(path)
    assert sf.rank == 2 and sf.pid == 4242
    batch = sf.read()
    assert batch.num_rows == 2 and sf.marks == ["optimizer"]
    assert batch.column("category").cast(pa.string()).to_pylist() == ["step", "input"]
    assert pc.cast(batch.column("start"), pa.int64()).to_pylist() == [T0, T0 + 10]
    assert batch.column("pid").to_pylist() == [4242, 4242]
    assert batch.column("tid").to_pylist() == [4243, 4243]
    assert sf.read() is None                         # nothing complete since
    with open(path, "a") as f:
        f.write(str(T0 + 20)[-1] + "\t4243\tProfilerStep#1\nstopped\tRuntimeError: boom\n")
    batch = sf.read()
    assert batch.column("name").to_pylist() == ["ProfilerStep#1"]
    assert pc.cast(batch.column("end"), pa.int64()).to_pylist() == [T0 + 20]
    assert sf.stopped == ["RuntimeError: boom"] and (sf.steps, sf.inputs) == (2, 1)


def test_a_trace_knows_whether_its_process_timed_its_steps(tmp_path):
    run = tmp_path / "run"
    for r in (0, 1):
        (run / f"rank={r}" / "traces").mkdir(parents=True)
    (run / "rank=0" / "traces" / "h_7.steps").write_text("counterprof-steps 1\tpid=7\thost=h\n")
    # its rank became known later: its traces are in another partition than its first steps
    assert steps_file_of_trace(run / "rank=1" / "traces" / "h_7.3.pt.trace.json")
    assert not steps_file_of_trace(run / "rank=1" / "traces" / "h_8.1.pt.trace.json")
    # the same in today's layout (rank folders under _ranks/)
    new = tmp_path / "new"
    for r in (0, 1):
        (new / "_ranks" / f"rank={r}" / "traces").mkdir(parents=True)
    (new / "_ranks" / "rank=0" / "traces" / "h_7.steps").write_text("counterprof-steps 1\tpid=7\thost=h\n")
    assert steps_file_of_trace(new / "_ranks" / "rank=1" / "traces" / "h_7.3.pt.trace.json")
    assert not steps_file_of_trace(new / "_ranks" / "rank=1" / "traces" / "h_8.1.pt.trace.json")
