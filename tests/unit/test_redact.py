"""redact_argv: what a derived output may show of a command line (counterprof/ground/redact.py)."""
from __future__ import annotations

import pytest

from counterprof.ground.redact import command_line, redact_argv


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


# -- issue 30: one pass over every string a command line holds ----------------------------------

@pytest.mark.parametrize("argv,shown", [
    # a secret inside one argument: the shell line a wrapper runs, to any depth
    (["sh", "-c", "python train.py --password=hunter2"], ["sh", "-c", "python train.py --password=***"]),
    (["sh", "-c", "python train.py --password hunter2 --lr 0.1"],
     ["sh", "-c", "python train.py --password *** --lr 0.1"]),
    (["sh", "-c", "python t.py --password='hunter 2' --lr 1"], ["sh", "-c", "python t.py --password=*** --lr 1"]),
    (["bash", "-lc", "bash -c \"python t.py --db_password=hunter2\""],
     ["bash", "-lc", "bash -c 'python t.py --db_password=***'"]),
    (["sh", "-c", "HF_TOKEN=abc python train.py"], ["sh", "-c", "HF_TOKEN=*** python train.py"]),
    (["sh", "-c", "export DB_PASSWORD=\"a b c\"; python t.py"], ["sh", "-c", "export DB_PASSWORD=***; python t.py"]),
    # camelCase and snake_case names, -D properties, hydra overrides
    (["python", "t.py", "--accessToken=abc", "--apiKey", "k1", "--clientSecret=s"],
     ["python", "t.py", "--accessToken=***", "--apiKey", "***", "--clientSecret=***"]),
    (["java", "-Ddb.password=pw", "-DAPI_KEY=k", "-jar", "x.jar"], ["java", "-Ddb.password=***", "-DAPI_KEY=***",
                                                                     "-jar", "x.jar"]),
    (["python", "t.py", "db.password=pw", "+api_key=k", "HFToken=t"],
     ["python", "t.py", "db.password=***", "+api_key=***", "HFToken=***"]),
    (["env", "PGPASSWORD=pw", "MYSQL_PWD=pw2", "PWD=/home/me", "psql"],
     ["env", "PGPASSWORD=***", "MYSQL_PWD=***", "PWD=/home/me", "psql"]),
    # a program's own password flag, by the program it follows
    (["mysql", "-uroot", "-phunter2", "db"], ["mysql", "-uroot", "-p***", "db"]),
    (["/usr/bin/mysqldump", "-phunter2"], ["/usr/bin/mysqldump", "-p***"]),
    (["sh", "-c", "mysql -uroot -phunter2 db; python -m pkg -pthread -p 8080"],
     ["sh", "-c", "mysql -uroot -p*** db; python -m pkg -pthread -p 8080"]),
    (["sshpass", "-p", "pw", "ssh", "h"], ["sshpass", "-p", "***", "ssh", "h"]),
    (["docker", "login", "-u", "me", "-p", "pw", "reg"], ["docker", "login", "-u", "me", "-p", "***", "reg"]),
    (["helm", "registry", "login", "-p", "pw"], ["helm", "registry", "login", "-p", "***"]),
    (["curl", "-u", "alice:pw", "--user=bob:pw2", "https://x"], ["curl", "-u", "alice:***", "--user=bob:***",
                                                                   "https://x"]),
    (["smbclient", "-U", "alice%pw", "//h/s"], ["smbclient", "-U", "alice%***", "//h/s"]),
    (["redis-cli", "-a", "pw"], ["redis-cli", "-a", "***"]),
    (["7z", "x", "-ppw", "a.7z"], ["7z", "x", "-p***", "a.7z"]),
    (["openssl", "enc", "-k", "pw", "-passin", "pass:pw2"], ["openssl", "enc", "-k", "***", "-passin", "pass:***"]),
    # headers, URLs, KEY=VALUE inside a string, token shapes
    (["sh", "-c", "curl -H 'Authorization: Bearer abc' https://x"],
     ["sh", "-c", "curl -H 'Authorization: Bearer ***' https://x"]),
    (["curl", "-H", "Authorization: ghp_raw", "-H", "X-Auth-Token: t", "-H", "Cookie: s=1; id=2"],
     ["curl", "-H", "Authorization: ***", "-H", "X-Auth-Token: ***", "-H", "Cookie: ***"]),
    (["sh", "-c", "git clone https://alice:pw@example.com/r.git"], ["sh", "-c", "git clone https://alice:***@example.com/r.git"]),
    (["x", "https://alice:p@ss@example.com/r"], ["x", "https://alice:***@example.com/r"]),
    (["curl", "-x", "alice:pw@proxy.local:8080", "https://x"], ["curl", "-x", "alice:***@proxy.local:8080", "https://x"]),
    (["git", "clone", "https://ghtoken0123456789abcdefXYZ@github.com/a/b"], ["git", "clone", "https://***@github.com/a/b"]),
    (["python", "x.py", "--config", '{"db": {"password": "pw", "user": "u"}}'],
     ["python", "x.py", "--config", '{"db": {"password": "***", "user": "u"}}']),
    (["python", "-c", 'login(token="abc")'], ["python", "-c", "login(token=***)"]),
    (["python", "-c", 'token = "abc"\nprint(1)'], ["python", "-c", 'token = "***"\nprint(1)']),
    (["psql", "host=x password=pw user=u"], ["psql", "host=x password=*** user=u"]),
    (["curl", "https://h/x?token=abc&user=1"], ["curl", "https://h/x?token=***&user=1"]),
    (["az", "x", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=k==;EndpointSuffix=e"],
     ["az", "x", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=***;EndpointSuffix=e"]),
    (["x", "hf_abcdefghijklmnopqrstuvwxyzABCDEF0123", "AKIAABCDEFGHIJKLMNOP"], ["x", "hf_***", "AKIA***"]),
    # a secret that looks like a keyword, a flag's value that starts with one dash
    (["python", "t.py", "--password", "do"], ["python", "t.py", "--password", "***"]),
    (["python", "t.py", "--password", "-dash-start"], ["python", "t.py", "--password", "***"]),
])
def test_secrets_anywhere_in_the_command_line_are_masked(argv, shown):
    assert redact_argv(argv) == shown


@pytest.mark.parametrize("argv", [
    # short flags that are no passwords: the letter alone never decides
    ["python", "-m", "pkg", "-p", "8080", "-pthread", "-phello"],
    ["docker", "run", "-p", "80:80", "img"],
    ["ssh", "-p", "22", "git@github.com"],
    ["mysql", "-u", "root", "-p", "dbname"],          # -p alone prompts; dbname is the database
    ["sh", "-c", "gcc -pthread x.c; python -m pkg -p 8080"],
    # ML names that end in token or key
    ["python", "x.py", "--pad-token", "<pad>", "--eos_token", "2", "--max-tokens", "5", "--sort-key", "name",
     "--primary-key", "id", "--max_new_tokens", "64"],
    ["python", "-c", "x = 1\nif x: pass\nelse: y = x == 2\nd = {'a': 1}"],
    ["python", "-c", "if password == guess: pass"],
    ["mail", "mailto:alice@example.com", "git@github.com:a/b", "ssh://git@host/r"],
    ["python", "x.py", "--no-password", "file.txt"],
    ["sh", "-c", "echo $HF_TOKEN; git -c credential.helper=store pull"],
])
def test_ordinary_flags_and_names_are_left_alone(argv):
    assert redact_argv(argv) == argv


def test_a_secret_never_survives_any_shape():
    """Every shape above, with a secret no rule could mistake for a name: it never shows."""
    secret = "Zq9-s3cr3t-Xw"
    shapes = [["--password=S"], ["--password", "S"], ["--accessToken=S"], ["sh", "-c", "x --api-key=S"],
              ["sh", "-c", "sh -c 'x --api_key S'"], ["sh", "-c", "TOKEN=S x"], ["mysql", "-pS"],
              ["sh", "-c", "mysql -pS"], ["curl", "-u", "u:S"], ["-H", "Authorization: Bearer S"],
              ["https://u:S@h/x"], ["x", "u:S@h.local:1"], ["python", "-c", "f(password='S')"],
              ["x", '{"apiKey": "S"}'], ["x", "a=1&secret=S"], ["x", "password: S"]]
    for shape in shapes:
        argv = [a.replace("S", secret) for a in shape]
        assert secret not in command_line(argv), argv
        assert "***" in command_line(argv), argv


def test_redacting_twice_changes_nothing_more():
    """A history file keeps the redacted command and `history show` redacts it again."""
    argvs = [["sh", "-c", "mysql -phunter2; curl -u a:b https://h?token=t -H 'Cookie: c=1'"],
             ["x", "--password", "p", "--accessToken=t", "https://ghtoken0123456789abcdefXYZ@github.com/a",
              "hf_abcdefghijklmnopqrstuvwxyzABCDEF0123", '{"apiKey": "k"}', "Authorization: Bearer b"]]
    for argv in argvs:
        once = redact_argv(argv)
        assert redact_argv(once) == once


def test_a_huge_hostile_argument_is_redacted_in_linear_time():
    """128 KB arguments (the kernel's limit per argument) shaped to make a careless pattern
    backtrack: all of them together in a few seconds even on a loaded machine."""
    import time
    shapes = ["a" * 131072, "a." * 65536, "a:" * 65536, "http://" * 18000, "'\"" * 65536,
              "password=" * 14000, " " * 131072 + "x", "a:b@" * 32000, "\\" * 131072, "(" * 131072,
              "authorization: " * 9000, "bearer " * 18000, "sh -c '" * 18000, "--password " * 12000,
              "a:b@" + "c" * 131072 + "!", "A" * 131072 + "=x", "-" * 131072, "token: " * 18000,
              "a=1&token=" * 12000, '"key": "' * 16000, "key" + " " * 131072 + "x"]
    t0 = time.perf_counter()
    for s in shapes:
        redact_argv(["sh", "-c", s, s])
    assert time.perf_counter() - t0 < 30
