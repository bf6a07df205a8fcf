"""What a derived output may show of a command line: secrets taken out.

meta.json keeps the command as it was run (it is the run's record, 0600, in a 0700 directory).
Everything derived from it that is meant to be read by others or kept elsewhere (the report in
text, JSON and HTML, the run's summary, compare, the history file and its HTML) shows the
command through `redact_argv()` / `command_line()`: the one place that decides what looks like a
secret.

Redacted (the value becomes ***, the name stays so the line still reads as what was run):
- an option named like a secret, `--password=x` or `--password x`: password, passwd, pass,
  token, secret, credential(s), key / api-key / access-key / private-key, auth (with any
  prefix: `--hf-token`, `--db-password`, `--wandb-api-key`);
- an environment assignment named like one, `HF_TOKEN=x` (`env HF_TOKEN=x python ...`):
  *_KEY, *_TOKEN, *_SECRET, *_PASSWORD, *_PASSWD, *_PASS, *_CREDENTIALS, *_AUTH;
- the password of a URL, `https://user:pw@host` -> `https://user:***@host`, anywhere in an
  argument;
- an HTTP authorization value, `Bearer x`, `Authorization: Basic x`.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

MASK = "***"

_SECRET_WORD = r"(?:password|passwd|pass|token|secret|credentials?|key|apikey|auth)"
# an option's name: the secret word is the whole name or its last dash/underscore part
_OPTION = re.compile(rf"^(-{{1,2}}(?:[a-z0-9]+[-_])*{_SECRET_WORD})(=(.*))?$", re.IGNORECASE | re.DOTALL)
_OPTION_PASSWORD = re.compile(r"^(-{1,2}[a-z0-9_-]*?pass(?:word|wd))(=(.*))?$", re.IGNORECASE | re.DOTALL)
_ENV = re.compile(r"^((?:[A-Za-z0-9]+_)*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|AUTH|"
                  r"APIKEY))=(.+)$", re.IGNORECASE | re.DOTALL)
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^/@\s:]*):([^/@\s]*)@", re.IGNORECASE)
_AUTH_VALUE = re.compile(r"(\bbearer|authorization:\s*\w+)\s+\S+", re.IGNORECASE)


def _option(arg: str) -> re.Match[str] | None:
    return _OPTION.match(arg) or _OPTION_PASSWORD.match(arg)


def redact_text(text: str) -> str:
    """One argument (or any text) with URL passwords and authorization values masked."""
    text = _URL_PASSWORD.sub(rf"\1:{MASK}@", text)
    return _AUTH_VALUE.sub(rf"\1 {MASK}", text)


def redact_argv(argv: Iterable[str] | None) -> list[str]:
    """A command line as a derived output may show it (see the module's rules)."""
    out: list[str] = []
    mask_next = False
    for arg in (str(a) for a in (argv or [])):
        if mask_next and not arg.startswith("--"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        m = _option(arg)
        if m:
            if m.group(2) is not None:
                out.append(f"{m.group(1)}={MASK}")
            else:
                out.append(arg)
                mask_next = True
            continue
        m = _ENV.match(arg)
        if m:
            out.append(f"{m.group(1)}={MASK}")
            continue
        out.append(redact_text(arg))
    return out


def command_line(argv: Iterable[str] | None) -> str:
    """The command as one shell line, redacted ("" when there is none)."""
    return shlex.join(redact_argv(argv))
