"""The documentation's code that reads a run, run as written on a real run: every ```python block
that README.md or a page of docs/ marks with `<!-- runnable: reads a run (RUN) -->` (on the line
before it), with RUN standing for the run's path. Each statement that is an expression must give
the run's rows with their rank (a table, a dataset, a DataFrame, a DuckDB relation, a Polars
frame).

And the links: every relative link in README.md names a file or folder of the repository, and
every link from a docs page to a file outside docs/ does too (mkdocs checks the links between
docs pages, and their anchors, when `.ci/docs` builds the site)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import REPO, two_rank_run

MARK = "<!-- runnable: reads a run (RUN) -->"
# the mark on a line of its own (a page may name it in running text, as docs/TESTS.md does)
MARK_LINE = re.compile("^" + re.escape(MARK) + "$", re.M)
BLOCK = re.compile("^" + re.escape(MARK) + r"\n```python\n(.*?)\n```", re.S | re.M)
# [text](target): the text may wrap onto the next line; images (![...]) are links too
LINK = re.compile(r"\[[^\[\]]*\]\(([^()\s]+)\)")
FENCED = re.compile(r"^```.*?^```", re.S | re.M)


def pages() -> list[Path]:
    """README.md, then every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks() -> list[tuple[str, str]]:
    """(where, source) of every runnable block: where is `README.md#1`, `docs/x.md#2`, ..."""
    found = []
    for page in pages():
        text = page.read_text()
        sources = BLOCK.findall(text)
        assert len(sources) == len(MARK_LINE.findall(text)), \
            f"{page.name}: a runnable mark not followed by a ```python block"
        name = page.relative_to(REPO).as_posix()
        found += [(f"{name}#{i + 1}", source) for i, source in enumerate(sources)]
    return found


def relative_links(page: Path) -> list[str]:
    """The relative link targets of a page, outside code blocks, without their #anchor."""
    text = FENCED.sub("", page.read_text())
    targets = (t.split("#", 1)[0] for t in LINK.findall(text))
    return [t for t in targets if t and not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("/")]


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
    raise AssertionError(f"a documented example gives a {type(value).__name__}, not a table")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return two_rank_run(tmp_path_factory.mktemp("readme") / "run")


def test_the_docs_mark_the_dataset_one_liners():
    code = "\n".join(source for _, source in blocks())
    for table in ("samples", "spans"):
        for line in (f'pyarrow.dataset.dataset("RUN/{table}", partitioning="hive")',
                     f'pandas.read_parquet("RUN/{table}")',
                     f"duckdb.sql(\"select * from 'RUN/{table}/*/*.parquet'\")",
                     f'polars.scan_parquet("RUN/{table}/**/*.parquet", hive_partitioning=True)'):
            assert line in code, line


def test_the_readme_has_a_runnable_block():
    assert any(where.startswith("README.md#") for where, _ in blocks())


@pytest.mark.parametrize("where, source", blocks(), ids=[where for where, _ in blocks()])
def test_a_documented_block_runs_on_a_real_run(run_dir, where, source):
    source = source.replace('"RUN', f'"{run_dir}').replace("'RUN", f"'{run_dir}")
    assert "RUN" not in source, "RUN outside a string literal"
    tree = ast.parse(source)
    scope: dict = {}
    expressions = 0
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr):
            value = eval(compile(ast.Expression(stmt.value), where, "eval"), scope)
            rows, columns = rows_and_columns(value)
            assert rows > 0 and "rank" in columns, ast.unparse(stmt)
            expressions += 1
        else:
            exec(compile(ast.Module([stmt], []), where, "exec"), scope)
    assert expressions > 0, "a runnable block that reads nothing"


def test_every_relative_link_of_the_readme_exists():
    links = relative_links(REPO / "README.md")
    assert any(link.startswith("docs/") for link in links), "the README links no docs page"
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, f"README.md links what the repository does not have: {missing}"


@pytest.mark.parametrize("page", sorted((REPO / "docs").glob("*.md")), ids=lambda p: p.name)
def test_a_docs_link_out_of_docs_names_a_repository_file(page):
    docs = (REPO / "docs").resolve()
    missing = []
    for link in relative_links(page):
        target = (page.parent / link).resolve()
        if target != docs and docs not in target.parents:
            if REPO.resolve() not in target.parents or not target.exists():
                missing.append(link)
    assert not missing, f"{page.name} links what the repository does not have: {missing}"
