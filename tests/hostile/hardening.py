"""Issue 30's hostile classes (the third hardening pass), in the hostile pass's Case form.

- race:    `history add` by several processes at once onto a new (or existing) history file: every
           process exits 0 and every run is in the file afterwards (the file was deleted after a
           reported success in 4 of 6 trials before);
- secrets: a secret inside one argument (`sh -c '... --password=x'`), camelCase and snake_case
           names, a program's own password flag (`mysql -pX`), `Authorization:`, URLs, `KEY=VALUE`
           in a string, token shapes: `report --json` of a real run shows none of them and shows
           `***` where each was; ordinary short flags (`-p 8080`, `-pthread`, `docker run -p`)
           are shown as they were; one case reads every output (report text, JSON and HTML,
           compare text/JSON/markdown, the history file and `history show`, the run's summary
           and `run --serve`'s /metrics over loopback) of one run that holds them all;
- output:  `-o ""` (an unset shell variable) is exit 2 with a line that says so, and the current
           directory stays empty (run, run -r, top, merge, import);
- exec:    a workload that cannot be executed exits as bash exits for it (126 or 127) with bash's
           reason, nothing created: a directory the user cannot search (as another user), a
           file that is not executable (named, or found on PATH), a directory, a path through a
           file, a loop of links, a name too long, a missing file or a dangling link;
- serve:   `run --serve` held by 200 idle connections keeps its thread count, still answers
           /metrics, and closes them after its read timeout; a client that sends a byte every
           half second is closed at the same deadline; malformed requests are answered 4xx and
           the endpoint goes on.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from helpers import COUNTERPROF, PYTHON  # noqa: E402

CMD_TIMEOUT = 120


def _cli(args: list[str], cwd: Path, env: dict | None = None, timeout: float = CMD_TIMEOUT,
         prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*(prefix or []), *COUNTERPROF, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})


def _copy_run(src: Path, dst: Path, run_id: str) -> Path:
    """A copy of a finished run under another id (history keeps one row per run id)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    meta = json.loads((dst / "meta.json").read_text())
    meta["id"] = run_id
    (dst / "meta.json").write_text(json.dumps(meta))
    return dst


def _history_ids(db: Path) -> list[str] | str:
    """The run ids in a history file, or why they cannot be read."""
    if not db.exists():
        return f"{db.name} does not exist"
    code = ("import duckdb, json, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print(json.dumps([r[0] for r in c.execute('SELECT run_id FROM runs ORDER BY seq').fetchall()]))")
    p = subprocess.run([PYTHON, "-c", code, str(db)], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return f"cannot read {db.name}: {p.stderr.strip()[-200:]}"
    return json.loads(p.stdout)


# -- race ---------------------------------------------------------------------------------------

def _race_runner(src: Path, n: int, existing: bool = False, show: bool = False):
    def runner(work: Path, _argv: list[str]) -> tuple[int, str, list[str]]:
        runs = [_copy_run(src, work / f"run{i}", f"race-{work.name}-{i}") for i in range(n)]
        db = work / "perf.duckdb"
        db.unlink(missing_ok=True)
        expected = [f"race-{work.name}-{i}" for i in range(n)]
        if existing:
            first = _copy_run(src, work / "first", f"race-{work.name}-first")
            p = _cli(["history", "add", str(first), "--db", str(db)], work)
            if p.returncode != 0:
                return p.returncode, p.stderr, ["could not make the existing history file"]
            expected.append(f"race-{work.name}-first")
        cmds = [[*COUNTERPROF, "history", "add", str(r), "--db", str(db)] for r in runs]
        if show:
            cmds.append([*COUNTERPROF, "history", "show", "--db", str(db)])
        procs = [subprocess.Popen(c, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for c in cmds]           # at once: each reads its run, then all write
        outs = [p.communicate(timeout=CMD_TIMEOUT) for p in procs]
        problems, rc = [], 0
        seqs = []
        for p, (_out, err), cmd in zip(procs, outs, cmds):
            if p.returncode != 0:
                rc = rc or p.returncode
                problems.append(f"`{' '.join(cmd[-4:])}` exited {p.returncode}: {err.strip()[-200:]}")
            seqs += [int(m) for m in re.findall(r"added as run (\d+)", err)]
        ids = _history_ids(db)
        if isinstance(ids, str):
            problems.append(ids + " after every add said it was added")
        else:
            missing = set(expected) - set(ids)
            if missing:
                problems.append(f"runs missing from the file: {sorted(missing)} (it holds {ids})")
            if len(ids) != len(set(ids)):
                problems.append(f"a run is in the file twice: {ids}")
        if len(seqs) != n or len(set(seqs)) != n:
            problems.append(f"the adds said seqs {seqs}, not {n} distinct ones")
        left = [f.name for f in work.iterdir() if f.name.endswith((".tmp", ".tmp.wal"))]
        if left:
            problems.append(f"part-files left behind: {left}")
        return rc, "".join(e for _o, e in outs), problems
    return runner


def race_cases(p, quick: bool, Case) -> list:
    out = [Case("race", f"two-adds-new-file-{i}", lambda w: [], codes=(0,),
                runner=_race_runner(p.finished, 2)) for i in range(3 if quick else 10)]
    out.append(Case("race", "three-adds-new-file", lambda w: [], codes=(0,),
                    runner=_race_runner(p.finished, 3)))
    out.append(Case("race", "two-adds-existing-file", lambda w: [], codes=(0,),
                    runner=_race_runner(p.finished, 2, existing=True)))
    out.append(Case("race", "add-and-show-existing-file", lambda w: [], codes=(0,),
                    runner=_race_runner(p.finished, 1, existing=True, show=True)))
    return out


# -- secrets ------------------------------------------------------------------------------------

FAKE_TOOLS = ("mysql", "sshpass", "docker", "curl", "redis-cli", "zip", "keytool")

# (name, the workload's argv, the secrets, what the report must show instead)
SECRET_SHAPES: list[tuple[str, list[str], list[str], list[str]]] = [
    ("sh-c-equals", ["sh", "-c", ": python train.py --password=hunter2"], ["hunter2"], ["--password=***"]),
    ("sh-c-space", ["sh", "-c", ": python train.py --password hunter2 --lr 0.1"], ["hunter2"],
     ["--password *** --lr 0.1"]),
    ("sh-c-quoted", ["sh", "-c", ": python train.py --password='hunter 2x' --lr 1"], ["hunter", "2x"],
     ["--password=***"]),
    ("sh-c-nested", ["sh", "-c", "sh -c ': train --db_password=pw-nested1'"], ["pw-nested1"],
     ["--db_password=***"]),
    ("bash-lc", ["bash", "-lc", ": deploy --api-key=key-bashlc1 && : done"], ["key-bashlc1"], ["--api-key=***"]),
    ("camel-case", ["true", "--accessToken=tok-camel1", "--apiKey", "key-camel2", "--clientSecret=sec-camel3"],
     ["tok-camel1", "key-camel2", "sec-camel3"], ["--accessToken=***", "--apiKey", "--clientSecret=***"]),
    ("snake-case", ["true", "--hf_token", "tok-snake1", "db_password=pw-snake2", "+api_key=key-snake3"],
     ["tok-snake1", "pw-snake2", "key-snake3"], ["db_password=***", "+api_key=***"]),
    ("java-d", ["true", "-Ddb.password=pw-java1", "-DAPI_KEY=key-java2"], ["pw-java1", "key-java2"],
     ["-Ddb.password=***"]),
    ("mysql-p", ["mysql", "-uroot", "-ppw-mysql1", "db"], ["pw-mysql1"], ["-p***"]),
    ("sh-c-mysql-p", ["sh", "-c", "mysql -uroot -ppw-mysql2 db; : done"], ["pw-mysql2"], ["-p***"]),
    ("sshpass-p", ["sshpass", "-p", "pw-sshpass1", "ssh", "host"], ["pw-sshpass1"], ["-p ***"]),
    ("docker-login-p", ["docker", "login", "-u", "me", "-p", "pw-docker1", "registry.local"], ["pw-docker1"],
     ["-p ***"]),
    ("curl-user", ["curl", "-u", "alice:pw-curl1", "https://example.com"], ["pw-curl1"], ["alice:***"]),
    ("redis-a", ["redis-cli", "-a", "pw-redis1", "ping"], ["pw-redis1"], ["-a ***"]),
    ("zip-P", ["zip", "-P", "pw-zip1", "out.zip", "f"], ["pw-zip1"], ["-P ***"]),
    ("keytool", ["keytool", "-list", "-storepass", "pw-keytool1"], ["pw-keytool1"], ["-storepass ***"]),
    ("bearer-in-sh", ["sh", "-c", ": curl -H 'Authorization: Bearer tok-bearer1' https://x"], ["tok-bearer1"],
     ["Bearer ***"]),
    ("authorization-raw", ["true", "-H", "Authorization: tok-rawauth1"], ["tok-rawauth1"], ["Authorization: ***"]),
    ("auth-header-name", ["true", "-H", "X-Auth-Token: tok-xauth1"], ["tok-xauth1"], ["X-Auth-Token: ***"]),
    ("cookie", ["true", "-H", "Cookie: session=tok-cookie1"], ["tok-cookie1"], ["Cookie: ***"]),
    ("url-in-sh", ["sh", "-c", ": git clone https://alice:pw-url1@example.com/r.git"], ["pw-url1"],
     ["alice:***@example.com"]),
    ("url-at-in-password", ["true", "https://alice:pw@url2@example.com/r"], ["pw@url2", "url2"],
     ["alice:***@example.com"]),
    ("proxy-user-pass", ["true", "-x", "alice:pw-proxy1@proxy.local:8080"], ["pw-proxy1"], ["alice:***@proxy"]),
    ("url-token-user", ["true", "https://tokuser0123456789abcdefXYZ@github.com/a/b"],
     ["tokuser0123456789abcdefXYZ"], ["https://***@github.com"]),
    ("env-in-sh", ["sh", "-c", "HF_TOKEN=tok-env1 true"], ["tok-env1"], ["HF_TOKEN=***"]),
    ("export-in-sh", ["sh", "-c", "export DB_PASSWORD='pw env2'; true"], ["pw env2", "env2"], ["DB_PASSWORD=***"]),
    ("env-wrapper", ["env", "PGPASSWORD=pw-env3", "MYSQL_PWD=pw-env4", "true"], ["pw-env3", "pw-env4"],
     ["PGPASSWORD=***"]),
    ("json", ["true", "--config", '{"db": {"password": "pw-json1", "user": "u"}}'], ["pw-json1"],
     ['"password": "***"']),
    ("code", [PYTHON, "-c", 'token = "tok-code1"; login = dict(api_key="key-code2")'], ["tok-code1", "key-code2"],
     ["token = "]),
    ("conninfo", ["true", "host=db password=pw-conn1 user=u"], ["pw-conn1"], ["password=***"]),
    ("query-string", ["true", "https://h.local/x?token=tok-query1&user=1"], ["tok-query1"], ["token=***&user=1"]),
    ("openssl-pass", ["sh", "-c", ": openssl enc -k pw-ossl1 -passin pass:pw-ossl2"], ["pw-ossl1", "pw-ossl2"],
     ["pass:***"]),
    ("token-shapes", ["true", "hf_abcdefghijklmnopqrstuvwxyzABCDEF0123", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"],
     ["abcdefghijklmnopqrstuvwxyzABCDEF0123", "abcdefghijklmnopqrstuvwxyz0123456789"], ["hf_***", "ghp_***"]),
]

# ordinary flags and names that must be shown as they were run
KEPT_AS_RUN: list[tuple[str, list[str]]] = [
    ("short-flags", ["sh", "-c", ": python -m pkg -p 8080 -pthread; : docker run -p 80:80 img; "
                     ": ssh -p 22 git@github.com; : mysql -u root -p dbname"]),
    ("ml-names", ["true", "--pad-token", "<pad>", "--eos_token", "2", "--max-tokens", "5", "--key-size", "3",
                  "--sort-key", "name", "--tokens-per-batch", "4096", "--bypass", "y", "monkey=1"]),
    ("code", [PYTHON, "-c", "x = 1\nif x: pass\nelse: y = x == 2"]),
]


def _fake_tools(work: Path) -> dict:
    """A PATH whose first folder has do-nothing programs named like the password-taking ones."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in FAKE_TOOLS:
        f = bin_dir / name
        f.write_text("#!/bin/sh\nexit 0\n")
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}


def _leaks(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s in text]


def _report_runner(argv: list[str], secrets: list[str], shown: list[str], verbatim: bool = False):
    def runner(work: Path, _a: list[str]) -> tuple[int, str, list[str]]:
        env = _fake_tools(work)
        run = work / "run"
        p = _cli(["run", "-q", "-o", str(run), "--", *argv], work, env)
        if p.returncode != 0:
            return p.returncode, p.stderr, [f"the run failed: {p.stderr.strip()[-300:]}"]
        rep = _cli(["report", "--json", str(run)], work)
        problems = []
        if rep.returncode != 0:
            return rep.returncode, rep.stderr, ["report --json failed"]
        command = json.loads(rep.stdout)["run"]["command"]
        text = json.dumps(command) + " " + " ".join(command)
        if verbatim:
            if command != argv:
                problems.append(f"changed: {command!r} (was {argv!r})")
        else:
            leaked = _leaks(text + p.stderr + rep.stderr, secrets)
            if leaked:
                problems.append(f"shown: {leaked} in {command!r}")
            for s in shown:
                if s not in " ".join(command):
                    problems.append(f"{s!r} is not in the shown command {command!r}")
        return 0, p.stderr + rep.stderr, problems
    return runner


def _serve_line(proc: subprocess.Popen, lines: list[str], timeout: float = 60) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(lines):
            m = re.search(r"serving OpenMetrics on http://127\.0\.0\.1:(\d+)/metrics", line)
            if m:
                return int(m.group(1))
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def _drain(stream, into: list[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: [into.append(line) for line in stream], daemon=True)
    t.start()
    return t


def scrape(port: int, timeout: float = 10) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if r.status != 200:
            raise OSError(f"status {r.status}")
        return r.read().decode()


def _wait_scrape(port: int, proc: subprocess.Popen, want: str = "counterprof_run_info",
                 timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            text = scrape(port)
            if want in text:
                return text
        except OSError as exc:
            last = exc
        time.sleep(0.2)
    raise OSError(f"no /metrics with {want} within {timeout} s ({last})")


def _every_output_runner(work: Path, _a: list[str]) -> tuple[int, str, list[str]]:
    env = _fake_tools(work)
    stop = work / "stop"
    secrets = [s for _n, _argv, ss, _sh in SECRET_SHAPES for s in ss]
    # one script holding every shape (the top-level ones as its text), waiting to be scraped
    script = "; ".join([f"while [ ! -e {stop} ]; do sleep 0.05; done"]
                       + [": " + " ".join(_shell_word(a) for a in argv) for _n, argv, _s, _sh in SECRET_SHAPES])
    served = work / "served"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-I", "50", "--serve", "127.0.0.1:0", "-o", str(served),
                             "--", "sh", "-c", script, "sh", "--password", "hunter2", "--accessToken=tok-camel1"],
                            cwd=work, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    drain = _drain(proc.stderr, lines)
    problems: list[str] = []
    metrics = ""
    try:
        port = _serve_line(proc, lines)
        if port is None:
            problems.append("no `serving OpenMetrics on` line")
        else:
            metrics = _wait_scrape(port, proc, want="counterprof_run_info{command=")   # once attached
    except OSError as exc:
        problems.append(f"/metrics: {exc}")
    finally:
        stop.touch()
        try:
            proc.wait(timeout=CMD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(timeout=10)
    stderr = "".join(lines)
    if proc.returncode != 0:
        return proc.returncode, stderr, problems + ["the served run failed"]
    if "counterprof_run_info" in metrics and "***" not in metrics:
        problems.append("/metrics' run_info shows no *** (was the command there?)")
    other = work / "other"
    p = _cli(["run", "-o", str(other), "--", "sh", "-c", script.replace(f"while [ ! -e {stop} ]; do sleep 0.05; "
                                                                     "done; ", ""), "sh", "--password", "hunter2"],
             work, env)
    if p.returncode != 0:
        return p.returncode, p.stderr, problems + ["the second run failed"]
    html, db, hhtml, md = work / "r.html", work / "h.duckdb", work / "h.html", work / "c.md"
    outputs = {
        "run summary": stderr + p.stderr,
        "/metrics": metrics,
    }
    for name, args in [("report", ["report", str(served)]),
                       ("report --json", ["report", "--json", str(served)]),
                       ("report --html", ["report", str(served), "--html", str(html)]),
                       ("compare", ["compare", str(served), str(other), "--force"]),
                       ("compare --json", ["compare", "--json", str(served), str(other), "--force"]),
                       ("compare --markdown", ["compare", "--markdown", str(served), str(other), "--force"]),
                       ("history add", ["history", "add", str(served), str(other), "--db", str(db)]),
                       ("history show", ["history", "show", "--db", str(db)]),
                       ("history show --json", ["history", "show", "--json", "--db", str(db)]),
                       ("history show --html", ["history", "show", "--db", str(db), "--html", str(hhtml)])]:
        q = _cli(args, work)
        if q.returncode not in (0, 1):
            problems.append(f"{name} exited {q.returncode}: {q.stderr.strip()[-200:]}")
        outputs[name] = q.stdout + q.stderr
    for f in (html, hhtml):
        outputs[f.name] = f.read_text(errors="replace") if f.exists() else ""
    outputs["history file (bytes)"] = db.read_bytes().decode("latin-1") if db.exists() else ""
    code = ("import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print(c.execute('SELECT string_agg(command, chr(10)) FROM runs').fetchone()[0])")
    q = subprocess.run([PYTHON, "-c", code, str(db)], capture_output=True, text=True, timeout=60)
    outputs["history file (DuckDB)"] = q.stdout
    if "***" not in q.stdout:
        problems.append(f"the history file's commands hold no ***: {q.stdout[:300]!r} {q.stderr[-200:]}")
    for name, text in outputs.items():
        leaked = _leaks(text, secrets)
        if leaked:
            problems.append(f"{name} shows {leaked}")
    md.unlink(missing_ok=True)
    return 0, stderr, problems


def _shell_word(a: str) -> str:
    import shlex
    return shlex.quote(a)


def secret_cases(p, quick: bool, Case) -> list:
    out = [Case("secrets", name, lambda w: [], codes=(0,), runner=_report_runner(argv, secrets, shown))
           for name, argv, secrets, shown in SECRET_SHAPES]
    out += [Case("secrets", f"kept-{name}", lambda w: [], codes=(0,), runner=_report_runner(argv, [], [], True))
            for name, argv in KEPT_AS_RUN]
    out.append(Case("secrets", "every-output", lambda w: [], codes=(0,), runner=_every_output_runner))
    return out


# -- output -------------------------------------------------------------------------------------

def _empty_output_runner(args_of):
    def runner(work: Path, _a: list[str]) -> tuple[int, str, list[str]]:
        cwd = work / "cwd"
        cwd.mkdir()
        args = args_of(work)
        q = _cli(args, cwd, timeout=60)
        problems = []
        left = sorted(x.name for x in cwd.iterdir())
        if left:
            problems.append(f"wrote into the current directory: {left}")
        if len(q.stderr.strip().splitlines()) > 20:
            problems.append("more than a usage and one line")
        return q.returncode, q.stderr, problems
    return runner


def output_cases(p, quick: bool, Case) -> list:
    burn = ["--", "sh", "-c", "exit 0"]
    argvs = {
        "run": lambda w: ["run", "-q", "-o", "", *burn],
        "run-long-option": lambda w: ["run", "-q", "--output=", *burn],
        "run-repeat": lambda w: ["run", "-q", "-r", "2", "-o", "", *burn],
        "top": lambda w: ["top", "--duration", "1", "-o", ""],
        "merge": lambda w: ["merge", str(p.finished), str(p.killed), "-o", ""],
        "import": lambda w: ["import", str(w / "t.json"), "-o", ""],
    }
    return [Case("output", name, lambda w: [], codes=(2,), says="an empty path was given",
                 runner=_empty_output_runner(a)) for name, a in argvs.items()]


# -- exec ---------------------------------------------------------------------------------------

_OTHER: list | None = None


def other_user() -> tuple[list[str], int] | None:
    """How to run a command as a user the file permissions bind, and the owner to give a
    directory that user must not search: nobody (setpriv --reuid=65534) where this interpreter
    is reachable by nobody, else root without the capabilities that let it ignore permissions
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), for whom a directory of nobody's with mode 0700 is
    as closed. None where neither is possible (not root, no setpriv)."""
    global _OTHER
    if _OTHER is not None:
        return _OTHER[0]
    found = None
    if os.geteuid() == 0 and shutil.which("setpriv"):
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        ok = subprocess.run([*nobody, PYTHON, "-c", "import counterprof"], capture_output=True, cwd="/",
                            timeout=60)
        if ok.returncode == 0:
            found = (nobody, 0)
        else:
            nodac = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
            ok = subprocess.run([*nodac, PYTHON, "-c", "import counterprof"], capture_output=True, cwd="/",
                                timeout=60)
            if ok.returncode == 0:
                found = (nodac, 65534)
    _OTHER = [found]
    return found


def _bash_says(argv0: str, prefix: list[str], env: dict, cwd: Path) -> tuple[int, str]:
    """What bash does with the command: its exit status and its reason."""
    p = subprocess.run([*prefix, "bash", "-c", '"$@"', "bash", argv0], capture_output=True, text=True,
                       timeout=60, env={**os.environ, **env}, cwd=cwd)
    return p.returncode, p.stderr.strip().rsplit(": ", 1)[-1]


def _exec_runner(make, as_other: bool = False):
    """make(base) -> (argv0, env): the situation. counterprof's exit and reason must be bash's."""
    def runner(work: Path, _a: list[str]) -> tuple[int, str, list[str]]:
        prefix, owner = [], 0
        if as_other:
            other = other_user()
            if other is None:
                return 126, "permission denied (skipped: needs root and setpriv)", []
            prefix, owner = other
        base = work / "exec"
        base.mkdir()
        for q in [work, *work.parents]:       # the other user must reach the case's folder
            if q == Path("/"):
                break
            if as_other:
                q.chmod(q.stat().st_mode | 0o011)
        base.chmod(0o755)
        argv0, env = make(base, owner)
        want_rc, want_why = _bash_says(argv0, prefix, env, base)
        out = base / "out"
        q = subprocess.run([*prefix, *COUNTERPROF, "run", "-q", "-o", str(out), "--", argv0], capture_output=True,
                           text=True, timeout=CMD_TIMEOUT, env={**os.environ, **env, "HOME": str(base)},
                           cwd=base)
        problems = []
        if q.returncode != want_rc:
            problems.append(f"exit {q.returncode}, bash exits {want_rc} ({want_why})")
        if want_why.lower() not in q.stderr.lower():
            problems.append(f"does not say bash's reason {want_why!r}: {q.stderr.strip()[-200:]!r}")
        if out.exists():
            problems.append("a run directory was created for a command that cannot start")
        return q.returncode, q.stderr, problems
    return runner


def _locked(base: Path, owner: int) -> tuple[str, dict]:
    d = base / "locked"
    d.mkdir()
    w = d / "train.sh"
    w.write_text("#!/bin/sh\nexit 0\n")
    w.chmod(0o755)
    os.chown(d, owner, owner)
    d.chmod(0o700)
    return str(w), {}


def _not_executable(base: Path, _owner: int) -> tuple[str, dict]:
    f = base / "train.sh"
    f.write_text("#!/bin/sh\nexit 0\n")
    f.chmod(0o644)
    return str(f), {}


def _not_executable_on_path(base: Path, _owner: int) -> tuple[str, dict]:
    d = base / "bin"
    d.mkdir()
    f = d / "train-cmd"
    f.write_text("#!/bin/sh\nexit 0\n")
    f.chmod(0o644)
    return "train-cmd", {"PATH": f"{d}{os.pathsep}{os.environ.get('PATH', '')}"}


def _locked_on_path(base: Path, owner: int) -> tuple[str, dict]:
    w, _ = _locked(base, owner)
    return "train.sh", {"PATH": f"{Path(w).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _directory(base: Path, _owner: int) -> tuple[str, dict]:
    (base / "adir").mkdir()
    return str(base / "adir"), {}


def _through_a_file(base: Path, _owner: int) -> tuple[str, dict]:
    (base / "afile").write_text("x")
    return str(base / "afile" / "train.sh"), {}


def _link_loop(base: Path, _owner: int) -> tuple[str, dict]:
    (base / "loop").symlink_to(base / "loop")
    return str(base / "loop"), {}


def _dangling(base: Path, _owner: int) -> tuple[str, dict]:
    (base / "dangling").symlink_to(base / "nowhere")
    return str(base / "dangling"), {}


def _too_long(base: Path, _owner: int) -> tuple[str, dict]:
    return str(base / ("x" * 300)), {}


def _missing(base: Path, _owner: int) -> tuple[str, dict]:
    return str(base / "missing.sh"), {}


def exec_cases(p, quick: bool, Case) -> list:
    made = [("unsearchable-directory", _locked, True), ("unsearchable-directory-on-path", _locked_on_path, True),
            ("not-executable", _not_executable, False), ("not-executable-on-path", _not_executable_on_path, False),
            ("a-directory", _directory, False), ("through-a-file", _through_a_file, False),
            ("link-loop", _link_loop, False), ("dangling-link", _dangling, False),
            ("name-too-long", _too_long, False), ("missing", _missing, False)]
    return [Case("exec", name, lambda w: [], codes=(126, 127), runner=_exec_runner(make, other))
            for name, make, other in made]


# -- serve --------------------------------------------------------------------------------------

def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _closed(s: socket.socket) -> bool:
    """Whether the server closed s (EOF, or a reset), without waiting."""
    s.setblocking(False)
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _served(work: Path):
    stop = work / "stop"
    proc = subprocess.Popen([*COUNTERPROF, "run", "-I", "100", "--serve", "127.0.0.1:0", "-o", str(work / "run"),
                             "--", "sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.1; done"],
                            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    drain = _drain(proc.stderr, lines)
    return proc, stop, lines, drain


def _finish(proc, stop, lines, drain) -> tuple[int, str]:
    stop.touch()
    try:
        proc.wait(timeout=CMD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    drain.join(timeout=10)
    return proc.returncode, "".join(lines)


IDLE_SOCKETS = 200
READ_TIMEOUT_S = 5.0           # counterprof/serve_http.py's REQUEST_TIMEOUT_S


def _idle_runner(work: Path, _a: list[str]) -> tuple[int, str, list[str]]:
    proc, stop, lines, drain = _served(work)
    problems: list[str] = []
    socks: list[socket.socket] = []
    try:
        port = _serve_line(proc, lines)
        if port is None:
            return _finish(proc, stop, lines, drain)[0] or 1, "".join(lines), ["no `serving` line"]
        _wait_scrape(port, proc)
        time.sleep(1.0)                         # the collectors' threads have all started
        before = _threads(proc.pid)
        for _ in range(IDLE_SOCKETS):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(1.0)
        held = _threads(proc.pid)
        if held > before + 3:
            problems.append(f"{IDLE_SOCKETS} idle connections took the profiler from {before} to {held} threads")
        t0 = time.monotonic()
        try:
            scrape(port, timeout=10)
        except OSError as exc:
            problems.append(f"/metrics did not answer while {IDLE_SOCKETS} idle connections were held: {exc}")
        took = time.monotonic() - t0
        if took > 3:
            problems.append(f"/metrics took {took:.1f} s while idle connections were held")
        deadline = time.monotonic() + READ_TIMEOUT_S + 5
        while time.monotonic() < deadline and not all(_closed(s) for s in socks):
            time.sleep(0.25)
        still = sum(not _closed(s) for s in socks)
        if still:
            problems.append(f"{still} idle connections still open {READ_TIMEOUT_S + 5:.0f} s after they were made")
        try:
            scrape(port, timeout=10)
        except OSError as exc:
            problems.append(f"/metrics did not answer after the idle connections: {exc}")
    except OSError as exc:
        problems.append(str(exc))
    finally:
        for s in socks:
            s.close()
    rc, stderr = _finish(proc, stop, lines, drain)
    return rc, stderr, problems


def _dribble_runner(work: Path, _a: list[str]) -> tuple[int, str, list[str]]:
    proc, stop, lines, drain = _served(work)
    problems: list[str] = []
    try:
        port = _serve_line(proc, lines)
        if port is None:
            return _finish(proc, stop, lines, drain)[0] or 1, "".join(lines), ["no `serving` line"]
        _wait_scrape(port, proc)
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        t0 = time.monotonic()
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        closed_at = None
        while time.monotonic() - t0 < READ_TIMEOUT_S + 6:
            try:
                s.sendall(b"X")               # a header that never ends, half a second a byte
            except OSError:
                closed_at = time.monotonic() - t0
                break
            if _closed(s):
                closed_at = time.monotonic() - t0
                break
            s.setblocking(True)
            time.sleep(0.5)
        s.close()
        if closed_at is None:
            problems.append(f"a header sent a byte at a time was still read after {READ_TIMEOUT_S + 6:.0f} s")
        elif closed_at < READ_TIMEOUT_S - 1:
            problems.append(f"closed after {closed_at:.1f} s, before the read timeout")
        bad = {b"POST /metrics HTTP/1.0\r\n\r\n": b" 405 ", b"GET /nope HTTP/1.0\r\n\r\n": b" 404 ",
               b"\x16\x03\x01garbage\r\n\r\n": b" 400 ",
               b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 40000: b" 431 "}
        for req, status in bad.items():
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                try:
                    c.sendall(req)
                    got = c.recv(64)
                except OSError as exc:
                    got = repr(exc).encode()
                if status not in got:
                    problems.append(f"{req[:30]!r}: answered {got[:40]!r}, not{status.decode()}")
        scrape(port, timeout=10)
    except OSError as exc:
        problems.append(str(exc))
    rc, stderr = _finish(proc, stop, lines, drain)
    return rc, stderr, problems


def serve_cases(p, quick: bool, Case) -> list:
    return [Case("serve", "idle-connections", lambda w: [], codes=(0,), runner=_idle_runner),
            Case("serve", "slow-header-and-bad-requests", lambda w: [], codes=(0,), runner=_dribble_runner)]


def hardening_cases(p, quick: bool, Case) -> list:
    return (race_cases(p, quick, Case) + secret_cases(p, quick, Case) + output_cases(p, quick, Case)
            + exec_cases(p, quick, Case) + serve_cases(p, quick, Case))
