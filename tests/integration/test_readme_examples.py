"""The README's code that reads a run, run as written on a real run: every ```python block the
README marks with `<!-- runnable: reads a run (RUN) -->` (on the line before it), with RUN
standing for the run's path. Each statement that is an expression must give the run's rows with
their rank (a table, a dataset, a DataFrame, a DuckDB relation, a Polars frame)."""
from __future__ import annotations

import ast
import re

import pytest

from helpers import REPO, two_rank_run

MARK = "<!-- runnable: reads a run (RUN) -->"
BLOCK = re.compile(re.escape(MARK) + r"\n```python\n(.*?)\n```", re.S)


def blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    found = BLOCK.findall(text)
    assert len(found) == text.count(MARK), "a runnable mark not followed by a ```python block"
    return found


def rows_and_columns(value) -> tuple[int, list[str]]:
    """Row count and column names of whatever a reader returned."""
    import duckdb
    import pandas
    import polars
    import pyarrow as pa
    import pyarrow.dataset
    if isinstance(value, pyarrow.dataset.Dataset):
        return value.count_rows(), value.schema.names
    if isinstance(value, pa.Table):
        return value.num_rows, value.column_names
    if isinstance(value, pandas.DataFrame):
        return len(value), list(value.columns)
    if isinstance(value, duckdb.DuckDBPyRelation):
        return len(value.fetchall()), value.columns
    if isinstance(value, polars.LazyFrame):
        value = value.collect()
    if isinstance(value, polars.DataFrame):
        return value.height, value.columns
    raise AssertionError(f"a README example gives a {type(value).__name__}, not a table")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return two_rank_run(tmp_path_factory.mktemp("readme") / "run")


def test_the_readme_marks_the_dataset_one_liners():
    code = "\n".join(blocks())
    for table in ("samples", "spans"):
        for line in (f'pyarrow.dataset.dataset("RUN/{table}", partitioning="hive")',
                     f'pandas.read_parquet("RUN/{table}")',
                     f"duckdb.sql(\"select * from 'RUN/{table}/*/*.parquet'\")",
                     f'polars.scan_parquet("RUN/{table}/**/*.parquet", hive_partitioning=True)'):
            assert line in code, line


@pytest.mark.parametrize("index", range(len(blocks())))
def test_a_readme_block_runs_on_a_real_run(run_dir, index):
    source = blocks()[index].replace('"RUN', f'"{run_dir}').replace("'RUN", f"'{run_dir}")
    assert "RUN" not in source, "RUN outside a string literal"
    tree = ast.parse(source)
    scope: dict = {}
    expressions = 0
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr):
            value = eval(compile(ast.Expression(stmt.value), "README.md", "eval"), scope)
            rows, columns = rows_and_columns(value)
            assert rows > 0 and "rank" in columns, ast.unparse(stmt)
            expressions += 1
        else:
            exec(compile(ast.Module([stmt], []), "README.md", "exec"), scope)
    assert expressions > 0, "a runnable block that reads nothing"
