"""Each Parquet file of a real run says what its columns and metrics are measured in, for any
reader: the footer's key-value metadata (counterprof.units, counterprof.columns,
counterprof.schema_version) and the Arrow field metadata, read back with pyarrow, DuckDB,
Polars and pandas from a `counterprof run` of two ranks; and docs/run-directory.md's block
that reads them runs as written."""
from __future__ import annotations

import ast
import json
import re

import pytest

import counterprof
from counterprof.ground.schema import TABLES
from counterprof.store import rundir
from counterprof.store.parquet_meta import SCHEMA_VERSION, VALUE_UNIT
from helpers import REPO, two_rank_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return two_rank_run(tmp_path_factory.mktemp("units") / "run")


def files(run_dir, table):
    found = [f for _r, f in rundir.table_files(run_dir, table)]
    assert found, f"the run wrote no {table} file"
    return found


def kv(path) -> dict[str, str]:
    import pyarrow.parquet as pq
    return {k.decode(): v.decode() for k, v in pq.read_metadata(path).metadata.items()}


def test_each_samples_file_names_the_unit_of_every_metric_it_holds(run_dir):
    import pyarrow.parquet as pq
    catalog = counterprof.load(run_dir).catalog
    for f in files(run_dir, "samples"):
        meta = kv(f)
        assert meta["counterprof.schema_version"] == SCHEMA_VERSION and meta["counterprof.table"] == "samples"
        units = json.loads(meta["counterprof.units"])
        held = set(pq.read_table(f, columns=["metric"])["metric"].cast("string").to_pylist())
        assert set(units) == held, f                       # the metrics in this file, no others
        for metric, entry in units.items():
            want = catalog[metric]
            assert entry == {k: want[k] for k in ("unit", "kind", "source", "description")}, metric
        assert units["proc.cpu_user"]["unit"] == "s" and units["proc.rss"]["unit"] == "bytes"
        assert units["system.cpu_util"]["unit"] == "percent"


def test_field_metadata_gives_each_column_its_unit(run_dir):
    import pyarrow.parquet as pq
    for table, checks in (("samples", {"time": ("ns", "UTC"), "duration_ns": ("ns", None),
                                       "value": (VALUE_UNIT, None), "quality": ("fraction", None)}),
                          ("spans", {"start": ("ns", "UTC"), "end": ("ns", "UTC"), "bytes": ("bytes", None)})):
        for f in files(run_dir, table):
            schema = pq.read_schema(f)
            assert schema.equals(TABLES[table], check_metadata=False)
            columns = json.loads(kv(f)["counterprof.columns"])
            for name, (unit, tz) in checks.items():
                md = {k.decode(): v.decode() for k, v in schema.field(name).metadata.items()}
                assert md["unit"] == unit and columns[name]["unit"] == unit, (f, name)
                assert md.get("timezone") == tz == columns[name].get("timezone"), (f, name)
            assert "counterprof.units" not in kv(f) or table == "samples"


def test_duckdb_reads_the_units_from_the_footer(run_dir):
    import duckdb
    rows = duckdb.sql(f"select file_name, decode(key), decode(value) from "
                      f"parquet_kv_metadata('{run_dir}/*/*/*.parquet')").fetchall()
    by_file: dict[str, dict[str, str]] = {}
    for name, key, value in rows:
        by_file.setdefault(name, {})[key] = value
    expected = {str(f) for t in ("samples", "spans") for f in files(run_dir, t)}
    assert set(by_file) == expected
    for name, keys in by_file.items():
        table = "samples" if "/samples/" in name else "spans"
        assert keys["counterprof.table"] == table and keys["counterprof.schema_version"] == SCHEMA_VERSION
        assert json.loads(keys["counterprof.columns"])["time" if table == "samples" else "start"]["unit"] == "ns"
        assert ("counterprof.units" in keys) == (table == "samples")
    # the units joined to the rows, in SQL alone: every row's metric has its unit
    joined = duckdb.sql(f"""
        with u as (select file_name, decode(value)::json as units from parquet_kv_metadata(
                     '{run_dir}/samples/*/*.parquet') where decode(key) = 'counterprof.units')
        select s.metric, json_extract_string(u.units, '$."' || s.metric || '".unit') as unit, count(*)
        from read_parquet('{run_dir}/samples/*/*.parquet', filename = true) s
        join u on u.file_name = s.filename group by all""").fetchall()
    units = {m: u for m, u, _n in joined}
    assert units["proc.cpu_user"] == "s" and units["proc.rss"] == "bytes" and None not in units.values()
    assert sum(n for *_x, n in joined) == counterprof.load(run_dir).samples().num_rows


def test_polars_and_pandas_read_the_files_and_polars_the_keys(run_dir):
    import pandas
    import polars
    for f in files(run_dir, "samples"):
        keys = polars.read_parquet_metadata(f)
        assert json.loads(keys["counterprof.units"])["proc.rss"]["unit"] == "bytes"
    n = counterprof.load(run_dir).samples().num_rows
    assert polars.scan_parquet(f"{run_dir}/samples/**/*.parquet", hive_partitioning=True).collect().height == n
    assert len(pandas.read_parquet(f"{run_dir}/samples")) == n


def test_the_units_block_of_the_docs_runs_on_a_real_run(run_dir):
    page = (REPO / "docs" / "run-directory.md").read_text()
    found = re.findall(r"^<!-- runnable: reads a run's units \(RUN\) -->\n```python\n(.*?)\n```", page, re.S | re.M)
    assert len(found) == 1
    source = found[0].replace('"RUN', f'"{run_dir}').replace("'RUN", f"'{run_dir}")
    assert "RUN" not in source
    scope: dict = {}
    exec(compile(ast.parse(source), "run-directory.md", "exec"), scope)
    assert scope["units"]["proc.cpu_user"]["unit"] == "s"
    assert scope["value"][b"unit"] == VALUE_UNIT.encode()
    assert {name for name, _u in scope["kv"]} == {str(f) for f in files(run_dir, "samples")}
    assert all(json.loads(u)["proc.rss"]["unit"] == "bytes" for _n, u in scope["kv"])
