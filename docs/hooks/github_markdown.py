"""MkDocs hook: pages written for GitHub's rendering read the same on the site.

Links that leave docs/: on GitHub ``../benchmark/README.md`` is a file of the repository. On the
site, a relative link that leaves docs/ for a Markdown page or an image brings that file into the
site at its repository path (``benchmark/README.md``; then, in turn, the files that page links to,
such as ``results/*.png``), and every relative link is rewritten from repository paths
to site paths (docs/X is served as X). Other files (source files: name them in code spans) and
missing targets are not added, so ``--strict`` reports links to them.

Pipes in tables: GitHub needs ``\\|`` even inside a code span of a table row; Python-Markdown
keeps a code span's pipes in one cell and would show the backslash, so it is dropped there.
"""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import unquote, urlsplit, urlunsplit

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# The target of an inline link or image: `](target` up to whitespace or `)`.
LINK = re.compile(r"(\]\()([^)\s]+)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
SITE_SUFFIXES = (".md", ".png", ".jpg", ".jpeg", ".gif", ".svg")


def _paths(config: MkDocsConfig) -> tuple[str, str]:
    """The repository root (the folder of mkdocs.yml) and docs_dir, absolute."""
    return os.path.dirname(os.path.abspath(config.config_file_path)), config.docs_dir


def _link_target(url: str, page_path: str) -> str | None:
    """The absolute path a relative link of the file at ``page_path`` points to, else None."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path or url.startswith("/"):
        return None
    return os.path.normpath(os.path.join(os.path.dirname(page_path), unquote(parts.path)))


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _joins_site(target: str, repo: str, docs: str) -> bool:
    """Whether a link target outside docs/ is brought into the site."""
    return (
        not _inside(target, docs)
        and _inside(target, repo)
        and target.endswith(SITE_SUFFIXES)
        and os.path.isfile(target)
    )


def outside_files(pages: list[str], repo: str, docs: str) -> list[str]:
    """Repository paths outside docs/ that the pages link to, following the linked .md files."""
    found: set[str] = set()
    queue = list(pages)
    while queue:
        page_path = queue.pop()
        with open(page_path, encoding="utf-8") as f:
            text = f.read()
        for match in LINK.finditer(text):
            target = _link_target(match.group(2), page_path)
            if target is None or not _joins_site(target, repo, docs):
                continue
            relative = os.path.relpath(target, repo)
            if relative in found:
                continue
            found.add(relative)
            if target.endswith(".md"):
                queue.append(target)
    return sorted(found)


def _site_link(url: str, page: File, repo: str, docs: str) -> str:
    target = _link_target(url, page.abs_src_path or "")
    if target is None or not _inside(target, repo):
        return url
    site_path = os.path.relpath(target, docs if _inside(target, docs) else repo)
    path = posixpath.relpath(site_path, posixpath.dirname(page.src_uri) or ".")
    parts = urlsplit(url)
    return urlunsplit(("", "", path, parts.query, parts.fragment))


def _unescape_table_pipes(line: str) -> str:
    if not line.startswith("|"):
        return line
    return CODE_SPAN.sub(lambda span: span.group(0).replace("\\|", "|"), line)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    repo, docs = _paths(config)
    pages = [f.abs_src_path for f in files.documentation_pages() if f.abs_src_path]
    for relative in outside_files(pages, repo, docs):
        files.append(File(relative, repo, config.site_dir, config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.abs_src_path is None:  # a generated page
        return markdown
    repo, docs = _paths(config)

    def rewrite(match: re.Match[str]) -> str:
        return match.group(1) + _site_link(match.group(2), page.file, repo, docs)

    markdown = LINK.sub(rewrite, markdown)
    return "\n".join(_unescape_table_pipes(line) for line in markdown.split("\n"))
