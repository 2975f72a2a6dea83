"""An mkdocs hook for the links from docs/ to files outside it (benchmarks/README.md, a plot, a
source file).

The pages are written to be read on GitHub, where such a link is a relative path into the
repository; a site built from docs/ alone would break it, and mkdocs's own link check (which
``--strict`` makes fatal) would refuse it. Here each such link is checked instead: a target that
does not exist, or a ``#anchor`` that no heading of a Markdown target makes (GitHub's rule), is a
warning, so ``--strict`` still fails on it. The target is copied into the site under ``_repo/``
and the link pointed there; a Markdown target is copied as text (``.md.txt``), not rendered, so
the site does not take on its links.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

__all__ = ["github_anchors", "on_files", "on_page_markdown", "relative_links"]

log = logging.getLogger("mkdocs.hooks.repo_links")

# A Markdown link or image target: "](target)" or "](target "title")"; the target has no space.
_LINK = re.compile(r"\]\((?P<target>[^)\s#]*)(?P<anchor>#[^)\s]*)?(?P<title>\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^\s*```")
_HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*#*\s*$")
PREFIX = "_repo"


def relative_links(markdown: str, page_path: Path) -> list[tuple[str, str, Path]]:
    """(link target, anchor, resolved path) of every relative link of ``markdown``, a page at
    ``page_path`` (a bare ``#anchor`` resolves to the page itself); fenced code is skipped."""
    found = []
    in_fence = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for match in _LINK.finditer(line):
            target = match["target"]
            if "://" in target or target.startswith(("/", "mailto:")):
                continue
            resolved = page_path
            if target:
                resolved = Path(posixpath.normpath((page_path.parent / target).as_posix()))
            found.append((target, match["anchor"] or "", resolved))
    return found


def _outside_targets(markdown: str, page_path: Path, docs_dir: Path) -> list[tuple[str, str, Path]]:
    """`relative_links` that leave ``docs_dir``."""
    return [link for link in relative_links(markdown, page_path) if not link[2].is_relative_to(docs_dir)]


def _copy_name(path: Path, root: Path) -> str:
    relative = path.relative_to(root).as_posix()
    return f"{PREFIX}/{relative}.txt" if path.suffix == ".md" else f"{PREFIX}/{relative}"


def github_anchors(markdown_file: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown_file``: lowercased, punctuation
    dropped but for hyphens, spaces as hyphens, a repeat suffixed ``-1``, ``-2``..."""
    anchors: set[str] = set()
    in_fence = False
    for line in markdown_file.read_text("utf-8").splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        heading = None if in_fence else _HEADING.match(line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading["text"].lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def on_files(files: Any, config: Any) -> Any:
    """Add every existing file that a page links to outside docs/ to the site, under ``_repo/``."""
    from mkdocs.structure.files import File

    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    added: set[str] = set()
    for page in list(files.documentation_pages()):
        path = Path(page.abs_src_path)
        for _, _, target in _outside_targets(path.read_text("utf-8"), path, docs_dir):
            if target.is_file() and target.is_relative_to(root):
                name = _copy_name(target, root)
                if name not in added:
                    added.add(name)
                    files.append(File.generated(config, name, abs_src_path=str(target)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Check each link out of docs/ and point it at the copy ``on_files`` added."""
    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    path = Path(page.file.abs_src_path)
    replacements: dict[str, str] = {}
    for target, anchor, resolved in _outside_targets(markdown, path, docs_dir):
        where = f"{page.file.src_uri}: the link to {target}{anchor}"
        if not resolved.is_relative_to(root) or not resolved.is_file():
            log.warning(f"{where} names no file of the repository")
            continue
        if anchor and resolved.suffix == ".md" and anchor[1:] not in github_anchors(resolved):
            log.warning(f"{where}: {resolved.relative_to(root)} has no heading for {anchor}")
        copy = docs_dir / _copy_name(resolved, root)
        relative = posixpath.relpath(copy.as_posix(), path.parent.as_posix())
        kept = "" if resolved.suffix == ".md" else anchor
        replacements[f"]({target}{anchor}"] = f"]({relative}{kept}"
    for old, new in replacements.items():
        markdown = markdown.replace(old + ")", new + ")").replace(old + " ", new + " ")
    return markdown
