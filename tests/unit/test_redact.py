"""redact_argv: what a derived output may show of a command line (counterprof/redact.py)."""
from __future__ import annotations

import pytest

from counterprof.redact import command_line, redact_argv


@pytest.mark.parametrize("argv,shown", [
    (["--password=hunter2"], ["--password=***"]),
    (["--password", "hunter2", "--lr", "0.1"], ["--password", "***", "--lr", "0.1"]),
    (["--token", "abc"], ["--token", "***"]),
    (["--hf-token=abc", "--db_password", "x", "--wandb-api-key", "k"],
     ["--hf-token=***", "--db_password", "***", "--wandb-api-key", "***"]),
    (["-passwd", "x"], ["-passwd", "***"]),
    (["--secret=s", "--auth", "a", "--credentials", "c"], ["--secret=***", "--auth", "***", "--credentials", "***"]),
    (["env", "HF_TOKEN=hf_x", "AWS_SECRET_ACCESS_KEY=k", "OPENAI_API_KEY=sk", "DB_PASSWORD=p", "python"],
     ["env", "HF_TOKEN=***", "AWS_SECRET_ACCESS_KEY=***", "OPENAI_API_KEY=***", "DB_PASSWORD=***", "python"]),
    (["https://alice:pw@example.com/x", "git+ssh://bob:t@h/r.git"],
     ["https://alice:***@example.com/x", "git+ssh://bob:***@h/r.git"]),
    (["--url=https://u:p@h"], ["--url=https://u:***@h"]),
    (["-H", "Authorization: Bearer abc.def"], ["-H", "Authorization: Bearer ***"]),
    (["-H", "Authorization: Basic dXNlcjpwdw=="], ["-H", "Authorization: Basic ***"]),
    # flags with nothing to hide: a switch followed by another option is left as it is
    (["--token", "--lr", "0.1"], ["--token", "--lr", "0.1"]),
])
def test_secret_values_are_masked(argv, shown):
    assert redact_argv(argv) == shown


@pytest.mark.parametrize("argv", [
    ["python", "train.py", "--lr", "0.1", "--key-size", "3", "--bypass", "y", "--compass", "n"],
    ["torchrun", "--nproc-per-node", "2", "x.py", "--tokens-per-batch", "4096"],
    ["python", "-c", "print('basic training')", "https://example.com/no-credentials", "git@github.com:a/b"],
    ["sort", "monkey=1", "LR=0.1", "PATH=/usr/bin"],
])
def test_what_is_not_a_secret_is_left_alone(argv):
    assert redact_argv(argv) == argv


def test_the_shell_line_and_odd_inputs():
    assert command_line(["a b", "--password=x y"]) == "'a b' '--password=***'"
    assert command_line(None) == "" and redact_argv([]) == []
    assert redact_argv([1, 2]) == ["1", "2"]
