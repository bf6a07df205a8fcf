"""What a derived output may show of a command line: secrets taken out.

meta.json keeps the command as it was run (it is the run's record, 0600, in a 0700 directory).
Everything derived from it that is meant to be read by others or kept elsewhere (the report in
text, JSON and HTML, the run's summary, compare, the history file and its HTML, the live title,
`--serve`'s /metrics) shows the command through `redact_argv()` / `command_line()`: the one
place that decides what looks like a secret. It is one pass over every string of the command
line, and over every string inside one: an argument that is itself a command line or a piece
of code (`sh -c 'python train.py --password=x'`, `python -c 'login(token="x")'`,
`--config '{"password": "x"}'`) is read as shell words, to any depth up to 4, and the same
rules apply to its words and its text.

A *secret name* is a name whose parts (split at `-`, `_`, `.` and camelCase: `accessToken`,
`HFToken`, `db_password`, `X-Auth-Token`, `-Ddb.password`) hold password, passwd, secret or
passphrase anywhere, or end in token, key, apikey, auth, pass, pwd (after a prefix: MYSQL_PWD,
never PWD itself), bearer or credential(s), or whose last part ends in password/passwd
(PGPASSWORD). Not secret: `--tokens-per-batch`, `--key-size`, `--bypass`, `monkey=1`, a
`--no-password` switch's next word, and the tokenizer's and data's own keys and tokens
(`--pad-token`, `--eos_token`, `--sort-key`, `--max-tokens`: see _NOT_SECRET_BEFORE).

Redacted (the value becomes ***, the name stays so the line still reads as what was run):
- an option with a secret name, `--password=x`, `--password x`, `--accessToken=x`,
  `-Ddb.password=x` (the value of `--name x` unless it starts with `--`);
- an assignment with a secret name, `HF_TOKEN=x` (`env HF_TOKEN=x python ...`), `db_password=x`,
  hydra's `+api_key=x`, and the same inside any text: `token="x"`, `"password": "x"`,
  `password: x`, `pass:x` (openssl), `AccountKey=x;` in a connection string;
- a password-taking short flag of a known program, by the program it follows (the word's
  basename; a shell separator `; | & ( )` ends it), never by the letter alone, so `-p 8080`,
  `-pthread`, `python -m pkg` and `docker run -p 80:80` are left as they are:
  mysql/mariadb tools `-pSECRET` (attached only: `-p NAME` is a prompt and a database), 7z/rar
  `-pSECRET`, sshpass `-p`, zip/unzip `-P`, redis-cli `-a`, mongo tools `-p`, sqlcmd/bcp `-P`,
  ldap tools `-w`, openssl `-k`, keytool/jarsigner `-storepass`/`-keypass`, docker/podman/helm
  `login -p`; curl `-u`/`--user`/`--proxy-user` `user:***`, smbclient `-U user%***`;
- the password of a URL, `https://user:***@host`, and of a scheme-less `user:***@host`; a
  user-only URL credential of 20 or more characters (`https://***@github.com`, a token);
- an HTTP authorization value, `Bearer x`, `Authorization: Basic x`, `Authorization: x`, and a
  `Cookie:` header's value;
- tokens recognisable by their own shape wherever they stand (`hf_...`, `ghp_...`,
  `github_pat_...`, `glpat-...`, `sk-...`, `xox?-...`, `AKIA...`, `AIza...`, `npm_...`,
  `pypi-...`): the prefix stays, the rest becomes ***.
A secret passed positionally with no name and no known shape is not recognised.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable

MASK = "***"
MAX_DEPTH = 4              # sh -c "bash -c '...'": strings inside strings, this deep

# -- names -------------------------------------------------------------------------------------

_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_ANYWHERE = {"password", "passwd", "secret", "passphrase"}
_LAST = {"pass", "passphrase", "token", "key", "apikey", "auth", "bearer", "credential",
         "credentials", "privatekey", "secretkey", "accesskey", "authtoken", "accesstoken",
         "refreshtoken", "sessiontoken", "apitoken"}
# the part before a last "token" or "key" that makes it a tokenizer's, a table's or a sort's:
# `--pad-token`, `--eos_token`, `--sort-key`, `--primary-key` are no secrets
_NOT_SECRET_BEFORE = {
    "token": {"pad", "bos", "eos", "sep", "unk", "cls", "mask", "start", "end", "stop", "special",
              "max", "min", "num", "first", "last", "image", "vision", "audio", "video", "chat"},
    "key": {"sort", "primary", "partition", "cache", "group", "dict", "lookup", "foreign", "shard",
            "column", "join", "label", "input", "output", "target", "metric", "feature", "dataset",
            "image", "text", "data", "hash", "index", "prng", "rng", "seed", "random", "order",
            "dedup", "unique", "split", "map", "sample", "hot", "short"},
}


def is_secret_name(name: str) -> bool:
    """Whether an option's, a variable's or a key's name says its value is a secret."""
    parts = [p.lower() for p in _PARTS.findall(name)]
    if not parts:
        return False
    last = parts[-1]
    if any(p in _ANYWHERE for p in parts) or last.endswith(("password", "passwd")):
        return True
    if last == "pwd":
        return len(parts) > 1
    if last in _LAST:
        return not (len(parts) > 1 and parts[-2] in _NOT_SECRET_BEFORE.get(last, ()))
    return False


# -- programs' own password flags ----------------------------------------------------------------

_ALL, _COLON, _PERCENT = "all", "colon", "percent"   # what of the value is the secret
_ATTACHED, _EITHER = "attached", "either"            # -pX only, or -pX and -p X


def _flags(spec: dict[str, tuple[str, str]], *names: str) -> dict[str, dict[str, tuple[str, str]]]:
    return {n: spec for n in names}


_MYSQL = ("mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow", "mysqlcheck", "mysqlpump",
          "mysqlslap", "mysqlbinlog", "mysqlsh", "mariadb", "mariadb-dump", "mariadb-admin",
          "mariadb-import", "mariadb-show", "mariadb-check", "mariadb-slap", "mariadb-binlog")
TOOLS: dict[str, dict[str, tuple[str, str]]] = {
    **_flags({"-p": (_ATTACHED, _ALL)}, *_MYSQL, "7z", "7za", "7zr", "rar", "unrar"),
    **_flags({"-p": (_EITHER, _ALL)}, "sshpass", "mongo", "mongosh", "mongodump", "mongorestore",
             "mongoexport", "mongoimport", "mongostat", "mongotop"),
    **_flags({"-P": (_EITHER, _ALL)}, "zip", "unzip", "zipcloak", "sqlcmd", "bcp"),
    **_flags({"-a": (_EITHER, _ALL)}, "redis-cli", "valkey-cli", "keydb-cli"),
    **_flags({"-w": (_EITHER, _ALL)}, "ldapsearch", "ldapmodify", "ldapadd", "ldapdelete",
             "ldappasswd", "ldapwhoami", "ldapcompare", "ldapmodrdn"),
    **_flags({"-k": (_EITHER, _ALL)}, "openssl"),
    **_flags({n: (_EITHER, _ALL) for n in ("-storepass", "-keypass", "-srcstorepass", "-deststorepass",
                                           "-srckeypass", "-destkeypass", "-new")},
             "keytool", "jarsigner"),
    **_flags({"-u": (_EITHER, _COLON), "--user": (_EITHER, _COLON), "-U": (_EITHER, _COLON),
              "--proxy-user": (_EITHER, _COLON)}, "curl"),
    **_flags({"-U": (_EITHER, _PERCENT), "--user": (_EITHER, _PERCENT)}, "smbclient", "rpcclient",
             "smbcacls", "net"),
    # `docker run -p 80:80` publishes a port: -p is a password after `login` only
    **_flags({"-p": (_EITHER, _ALL)}, *(f"{t} login" for t in ("docker", "podman", "nerdctl",
                                                                 "buildah", "skopeo", "helm", "oras",
                                                                 "crane", "regctl"))),
}
_LOGIN_TOOLS = {t.split()[0] for t in TOOLS if t.endswith(" login")}


def _tool(word: str) -> str | None:
    base = os.path.basename(word)
    if base in TOOLS or base in _LOGIN_TOOLS:
        return base
    return None


def _part(value: str, mode: str) -> int | None:
    """Where the secret starts in a flag's value (None: it holds none)."""
    if mode == _ALL:
        return 0 if value else None
    sep = ":" if mode == _COLON else "%"
    i = value.find(sep)
    return i + 1 if i >= 0 and i + 1 < len(value) else None


# -- one word ------------------------------------------------------------------------------------

_OPTION = re.compile(r"(-{1,2})([A-Za-z0-9][A-Za-z0-9_.-]*)(?:=(.*))?", re.DOTALL)
_ASSIGN = re.compile(r"(?:\+{1,2}|~)?([A-Za-z_][A-Za-z0-9_.-]*)=(.+)", re.DOTALL)
# words after which a new command starts (a short flag belongs to the program before it)
_SEPARATORS = {";", ";;", "&", "&&", "|", "||", "|&", "(", ")", "{", "}", "!", "then", "do", "else",
               "elif", "\n"}


class _Words:
    """The word rules, in the order of a command line's words (one per command line: a flag's
    value is the next word, a short flag belongs to the program it follows)."""

    def __init__(self) -> None:
        self.pending: str | None = None       # the next word is a secret (how much of it)
        self.tool: str | None = None

    def separator(self) -> None:
        self.pending = self.tool = None

    def masks(self, w: str) -> list[tuple[int, int]]:
        """The spans of the word w (unquoted) that are secret; remembers what the next word is."""
        if self.pending is not None:
            mode, self.pending = self.pending, None
            if not w.startswith("--") and not (w in _SEPARATORS and not w.isalpha()):
                at = _part(w, mode)
                return [] if at is None else [(at, len(w))]
        if w in _SEPARATORS:
            self.tool = None
            return []
        tool = self.tool
        if tool in _LOGIN_TOOLS and w == "login":
            self.tool = f"{tool} login"
            return []
        if tool is not None and w.startswith("-"):
            hit = self._tool_flag(TOOLS.get(tool, {}), w)
            if hit is not None:
                return hit
        m = _OPTION.fullmatch(w)
        if m:
            dashes, name, value = m.group(1), m.group(2), m.group(3)
            secret = is_secret_name(name) or (len(dashes) == 1 and value is not None
                                               and is_secret_name(name[1:]))   # -Dapi.key=x
            if secret:
                if value is not None:
                    return [(m.start(3), len(w))] if value else []
                if not name.lower().startswith(("no-", "no_")):      # --no-password FILE
                    self.pending = _ALL
            return []
        m = _ASSIGN.fullmatch(w)
        if m:
            return [(m.start(2), len(w))] if is_secret_name(m.group(1)) else []
        t = _tool(w)
        if t is not None:
            self.tool = t
        return []

    def _tool_flag(self, flags: dict[str, tuple[str, str]], w: str) -> list[tuple[int, int]] | None:
        for flag, (how, mode) in flags.items():
            if w == flag:
                if how == _EITHER:
                    self.pending = mode
                return []
            if flag.startswith("--"):
                if w.startswith(flag + "="):
                    at = _part(w[len(flag) + 1:], mode)
                    return [] if at is None else [(len(flag) + 1 + at, len(w))]
            elif w.startswith(flag) and len(flag) == 2:
                at = _part(w[2:], mode)
                return [] if at is None else [(2 + at, len(w))]
        return None


# -- text ----------------------------------------------------------------------------------------

# a name and its = or :, then (for a secret name only: another name may sit in a value, as in
# ?a=1&token=x) its value: quoted (the quotes stay) or up to a blank, quote or separator
_NAME_SEP = re.compile(r"""(?<![A-Za-z0-9_.\-])(["']?)(-*[A-Za-z_][A-Za-z0-9_.\-]*)\1[ \t]*[=:][ \t]*""")
_VALUE = re.compile(r""""((?:[^"\\\n]|\\.)*)"|'([^'\n]*)'|([^\s'"=,;&|(){}\[\]<>][^\s'",;&|(){}\[\]<>]*)""")
_URL_PASSWORD = re.compile(r"(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*://[^/@\s:'\"]*:([^/\s'\"]+)@",
                           re.IGNORECASE)
_URL_TOKEN_USER = re.compile(r"(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*://([A-Za-z0-9_.~\-]{20,})@",
                             re.IGNORECASE)
_BARE_PASSWORD = re.compile(r"(?<![\w/:.%+\-@])(?!mailto:)[\w.%+\-]+:([^\s/@'\":]+)@(?=[\w.\-]+(?:[:/\s'\"]|$))")
_AUTH = re.compile(r"\b(?:proxy-)?authorization[ \t]*[:=][ \t]*(?:[A-Za-z][\w\-]*[ \t]+)?([^\s'\"]+)",
                   re.IGNORECASE)
_BEARER = re.compile(r"\bbearer[ \t]+([^\s'\"]+)", re.IGNORECASE)
_COOKIE = re.compile(r"\b(?:set-)?cookie[ \t]*:[ \t]*([^\n'\"]+)", re.IGNORECASE)
_SHAPES = re.compile(
    r"\b(?:(gh[pousr]_)[A-Za-z0-9]{30,}|(github_pat_)[A-Za-z0-9_]{40,}|(glpat-)[A-Za-z0-9_\-]{20,}"
    r"|(hf_)[A-Za-z0-9]{30,}|(sk-)(?:proj-|ant-)?[A-Za-z0-9_\-]{32,}|(xox[abprs]-)[A-Za-z0-9\-]{10,}"
    r"|((?:AKIA|ASIA))[0-9A-Z]{16}|(AIza)[0-9A-Za-z_\-]{35}|(npm_)[A-Za-z0-9]{36}"
    r"|(pypi-)[A-Za-z0-9_\-]{50,})(?![A-Za-z0-9])")


def _text_masks(s: str) -> list[tuple[int, int]]:
    """The secret spans of text s by the rules that read text rather than words."""
    out: list[tuple[int, int]] = []
    at = 0
    while (m := _NAME_SEP.search(s, at)) is not None:
        at = m.end()
        if is_secret_name(m.group(2)):
            v = _VALUE.match(s, m.end())
            if v is not None:
                g = next(i for i in (1, 2, 3) if v.group(i) is not None)
                if v.end(g) > v.start(g):
                    out.append((v.start(g), v.end(g)))
                at = v.end()        # a masked value is not read again for names (linear time)
    for rx in (_URL_PASSWORD, _URL_TOKEN_USER, _BARE_PASSWORD, _AUTH, _BEARER, _COOKIE):
        out.extend((m.start(1), m.end(1)) for m in rx.finditer(s) if m.end(1) > m.start(1))
    for m in _SHAPES.finditer(s):
        prefix = next(g for g in m.groups() if g is not None)
        out.append((m.start() + len(prefix), m.end()))
    return out


def _apply(s: str, masks: list[tuple[int, int]]) -> str:
    """s with each span of masks (merged where they touch or overlap) replaced by ***."""
    if not masks:
        return s
    merged: list[list[int]] = []
    for a, b in sorted(masks):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out, at = [], 0
    for a, b in merged:
        out.append(s[at:a])
        out.append(MASK)
        at = b
    out.append(s[at:])
    return "".join(out)


_SEP_CHARS = ";&|()\n"
_BLANK = " \t\r"
_NEEDS_LEXING = re.compile(r"[\s'\"\\;&|()]")


def _lex(s: str) -> list[tuple[int, int, str | None]]:
    """s as shell words: (raw start, raw end, unquoted value), a separator with value None.
    Tolerant: an unclosed quote runs to the end. One pass, linear in len(s)."""
    out: list[tuple[int, int, str | None]] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in _BLANK:
            i += 1
            continue
        if c in _SEP_CHARS:
            j = i + 1
            while j < n and s[j] in "&|" and c in "&|":
                j += 1
            out.append((i, j, None))
            i = j
            continue
        start, val = i, []
        while i < n and s[i] not in _BLANK and s[i] not in _SEP_CHARS:
            c = s[i]
            if c == "'":
                j = s.find("'", i + 1)
                j = n if j < 0 else j
                val.append(s[i + 1:j])
                i = j + 1
            elif c == '"':
                i += 1
                while i < n and s[i] != '"':
                    if s[i] == "\\" and i + 1 < n and s[i + 1] in '"\\$`\n':
                        i += 1
                    val.append(s[i])
                    i += 1
                i += 1
            elif c == "\\" and i + 1 < n:
                val.append(s[i + 1])
                i += 2
            else:
                val.append(c)
                i += 1
        out.append((start, min(i, n), "".join(val)))
    return out


_SCRIPT_FLAG = re.compile(r"-[A-Za-z]*c|--command")     # sh -c, bash -lc, python -c: a script next
_PLAIN = re.compile(r"[^\s'\"\\$`;&|()<>]*")


def _quote(value: str) -> str:
    """A word as a shell would read it back (as it was if it needs no quotes)."""
    if _PLAIN.fullmatch(value):
        return value
    if "'" not in value:
        return f"'{value}'"
    return shlex.quote(value)


def _redact_text(s: str, depth: int = 1) -> str:
    """Any text of a command line (an argument, a piece of it, code) with its secrets masked."""
    if depth > MAX_DEPTH or not _NEEDS_LEXING.search(s):
        return _apply(s, _text_masks(s))
    words = _Words()
    replaced: list[tuple[int, int, str]] = []
    for a, b, value in _lex(s):
        if value is None:
            words.separator()
            continue
        masks = words.masks(value)
        if masks:
            new = _apply(value, masks + _text_masks(value))
        elif _NEEDS_LEXING.search(value) and value != s[a:b]:
            new = _redact_text(value, depth + 1)
        else:
            continue
        if new != value:
            replaced.append((a, b, _quote(new)))
    out, at = [], 0
    for a, b, new in replaced:
        out.append(_apply(s[at:a], _text_masks(s[at:a])))
        out.append(new)
        at = b
    out.append(_apply(s[at:], _text_masks(s[at:])))
    return "".join(out)


def redact_text(text: str) -> str:
    """One argument (or any text: a shell line, code) with every secret the rules find masked."""
    return _redact_text(str(text))


def redact_argv(argv: Iterable[str] | None) -> list[str]:
    """A command line as a derived output may show it (see the module's rules)."""
    out: list[str] = []
    words = _Words()
    script = False
    for arg in (str(a) for a in (argv or [])):
        masks = words.masks(arg)
        if script and _NEEDS_LEXING.search(arg):
            masks = []       # sh -c 'HF_TOKEN=x python ...': a script, its words masked one by one
        out.append(_apply(arg, masks + _text_masks(arg)) if masks else _redact_text(arg))
        script = _SCRIPT_FLAG.fullmatch(arg) is not None
    return out


def command_line(argv: Iterable[str] | None) -> str:
    """The command as one shell line, redacted ("" when there is none)."""
    return shlex.join(redact_argv(argv))
