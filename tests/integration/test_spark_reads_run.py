"""docs/run-directory.md's Spark block, run as written in pyspark's local mode on a real run of
two ranks (its `s3://bucket/RUN` standing for the run's path): the rows Spark reads, per rank and
in total, are pyarrow's, and the times are the same epoch ns. Nothing is installed here: pyspark
comes with the `test` extra, Java with the system (CI: Debian's default-jre-headless); where
either is missing the test skips, and CI, which has both, fails on that skip (`required`)."""
from __future__ import annotations

import re
import shutil
from collections import Counter

import pytest

from helpers import REPO, two_rank_run

pytestmark = [pytest.mark.slow, pytest.mark.required]
MARK = "<!-- runnable with pyspark: reads a run (s3://bucket/RUN) -->"


def spark_block() -> str:
    page = (REPO / "docs" / "run-directory.md").read_text()
    found = re.findall("^" + re.escape(MARK) + r"\n```python\n(.*?)\n```", page, re.S | re.M)
    assert len(found) == 1, "docs/run-directory.md: the Spark block and its mark"
    return found[0]


@pytest.fixture(scope="module")
def spark():
    pyspark_sql = pytest.importorskip("pyspark.sql", reason="pyspark is not installed (the test extra has it)")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (Debian: default-jre-headless; .ci/run installs it)")
    session = (pyspark_sql.SparkSession.builder.master("local[1]").appName("counterprof-test")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
               .getOrCreate())
    yield session
    # session.stop() leaves pyspark's JVM (the py4j gateway) running for the rest of the test
    # process, holding ~400 MB and waking its threads: it is shut down and ended here
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    session.stop()
    if gateway is not None:
        proc = getattr(gateway, "proc", None)
        try:
            gateway.shutdown()
        finally:
            if proc is not None:
                proc.kill()
                proc.wait(timeout=30)
        SparkContext._gateway = SparkContext._jvm = None


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return two_rank_run(tmp_path_factory.mktemp("spark") / "run")


def test_the_documented_spark_block_reads_every_row_of_each_rank(spark, run_dir):
    import pyarrow.dataset as ds
    source = spark_block()
    assert "s3://bucket/RUN" in source
    scope = {"spark": spark}
    exec(compile(source.replace("s3://bucket/RUN", str(run_dir)), "run-directory.md", "exec"), scope)
    for table in ("samples", "spans"):
        frame = scope[table]
        arrow = ds.dataset(f"{run_dir}/{table}", partitioning="hive").to_table()
        want = Counter(arrow["rank"].to_pylist())
        assert set(want) == {0, 1} and all(want.values())
        got = Counter({r["rank"]: r["count"] for r in frame.groupBy("rank").count().collect()})
        assert got == want, table
        time = "time" if table == "samples" else "start"
        assert dict(frame.dtypes)[time] == "bigint"            # nanosAsLong: epoch ns as a long
        ns = sorted(r[0] for r in frame.select(time).collect())
        assert ns == sorted(arrow[time].cast("int64").to_pylist())
        assert [c for c in frame.columns if c != "rank"] == [f for f in arrow.schema.names if f != "rank"]
