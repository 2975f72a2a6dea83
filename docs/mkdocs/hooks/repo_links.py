"""An mkdocs hook for the links from docs/ to files outside it (benchmarks/README.md, a plot, a
source file).

The pages are written to be read on GitHub, where such a link is a relative path into the
repository; a site built from docs/ alone would break it, and mkdocs's own link check (which
``--strict`` makes fatal) would refuse it. Here each such link is checked instead: a target that
does not exist, or a ``#anchor`` that no heading of a Markdown target makes (GitHub's rule), is a
warning, so ``--strict`` still fails on it. The target is added to the site under ``_repo/``, at
its path in the repository, and the link pointed there. A Markdown target is rendered as a page
of the site (outside the navigation), so that a link keeps its anchor: the site's headings take
GitHub's anchors (``toc.slugify`` in mkdocs.yml). Its own links are followed alike, so that the
files it links to come too, and its links into docs/ land on the docs' pages. A link to a folder
goes to its README.md where it has one, else becomes its text (GitHub lists a folder, a site
cannot).
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
    return f"{PREFIX}/{path.relative_to(root).as_posix()}"


def _readme_of(path: Path) -> Path:
    """``path``, or for a folder its README.md (where it has none: the folder, not a file)."""
    return path / "README.md" if path.is_dir() and (path / "README.md").is_file() else path


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
    """Add every existing file that a page links to outside docs/ to the site, under ``_repo/``;
    a Markdown one as a page, whose own links are followed in turn."""
    from mkdocs.structure.files import File, InclusionLevel

    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    pending = [Path(page.abs_src_path) for page in files.documentation_pages()]
    added: set[str] = set()
    while pending:
        path = pending.pop()
        for _, _, resolved in _outside_targets(path.read_text("utf-8"), path, docs_dir):
            target = _readme_of(resolved)
            name = _copy_name(target, root) if target.is_relative_to(root) else ""
            if not target.is_file() or not name or name in added:
                continue
            added.add(name)
            page = target.suffix == ".md"
            inclusion = InclusionLevel.NOT_IN_NAV if page else InclusionLevel.UNDEFINED
            files.append(File.generated(config, name, abs_src_path=str(target), inclusion=inclusion))
            if page:
                pending.append(target)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Check each link out of docs/ and point it at the copy ``on_files`` added; on a page
    added from outside docs/, point its links into docs/ at the docs' pages."""
    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    path = Path(page.file.abs_src_path)  # where the page is in the repository
    site_dir = posixpath.dirname(page.file.src_uri)  # and where it is in the site
    replacements: dict[str, str] = {}
    folders: set[str] = set()
    for target, anchor, resolved in relative_links(markdown, path):
        if resolved.is_relative_to(docs_dir):
            if path.is_relative_to(docs_dir) or not target:
                continue  # mkdocs checks and resolves the docs' links among themselves
            site_path = resolved.relative_to(docs_dir).as_posix()
        else:
            where = f"{page.file.src_uri}: the link to {target}{anchor}"
            resolved = _readme_of(resolved)
            if resolved.is_relative_to(root) and resolved.is_dir() and not anchor:
                folders.add(target)  # GitHub lists a folder; the site has no page for it
                continue
            if not resolved.is_relative_to(root) or not resolved.is_file():
                log.warning(f"{where} names no file of the repository")
                continue
            if anchor and resolved.suffix == ".md" and anchor[1:] not in github_anchors(resolved):
                log.warning(f"{where}: {resolved.relative_to(root)} has no heading for {anchor}")
            site_path = _copy_name(resolved, root)
        replacements[f"]({target}{anchor}"] = f"]({posixpath.relpath(site_path, site_dir or '.')}{anchor}"
    for old, new in replacements.items():
        markdown = markdown.replace(old + ")", new + ")").replace(old + " ", new + " ")
    for folder in folders:  # its link becomes its text
        markdown = re.sub(rf"\[(?P<text>[^\]]*)\]\({re.escape(folder)}\)", r"\g<text>", markdown)
    return markdown
