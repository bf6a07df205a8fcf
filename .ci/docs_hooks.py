"""mkdocs hook (mkdocs.yml `hooks:`): links from a docs page to a repository file outside docs/.

The pages are read on GitHub too, where `[README](../README.md)` or a link to a source file
works; in the built site nothing outside docs/ exists, and strict mode fails on such a link. So
before mkdocs validates a page, each relative link that leaves docs/ is checked here: a target
that is not a file or folder of the repository fails the build (as a broken link inside docs/
does in mkdocs' own validation); one that exists is printed as its text and its repository
path, `text (path)`, with no link. Links inside docs/ are left to mkdocs, which checks their
pages and anchors.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

# fenced code blocks (``` or ~~~, any indentation) and inline code spans: no link inside them
_CODE = re.compile(r"(?ms)^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$|(`+)(?:(?!\2).)+?\2", re.S)
_LINK = re.compile(r"(?<!!)\[([^\[\]]+)\]\(([^()\s]+)\)")


def _outside_target(target: str, page_dir: Path, docs: Path) -> Path | None:
    """The path a relative link names when it leaves docs/, else None (left to mkdocs)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = (page_dir / target.split("#", 1)[0]).resolve()
    return None if path == docs or docs in path.parents else path


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    page_dir = (docs / page.file.src_path).parent
    kept: list[str] = []

    def hide(m: re.Match[str]) -> str:
        kept.append(m.group(0))
        return f"\x00{len(kept) - 1}\x00"

    def relink(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        path = _outside_target(target, page_dir, docs)
        if path is None:
            return m.group(0)
        if repo not in path.parents or not path.exists():
            raise PluginError(f"{page.file.src_path}: the link {target!r} names no file of the repository")
        rel = path.relative_to(repo).as_posix()
        return text if rel in text else f"{text} (`{rel}`)"

    masked = _CODE.sub(hide, markdown)
    linked = _LINK.sub(relink, masked)
    return re.sub("\x00(\\d+)\x00", lambda m: kept[int(m.group(1))], linked)
