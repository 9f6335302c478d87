"""The docs site: `mkdocs build --strict` passes, its flag reference lists every server flag, and
a broken link fails the build."""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang.srt.server_args import ServerArgs

REPO = Path(__file__).resolve().parents[1]
Build = tuple[subprocess.CompletedProcess[str], Path]


def build_site(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def server_flags() -> list[argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    return [action for action in parser._actions if action.option_strings]


@pytest.fixture(scope="module")
def site_build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    site = tmp_path_factory.mktemp("site")
    return build_site(REPO, site), site


def test_strict_build_passes(site_build: Build) -> None:
    result, site = site_build
    assert result.returncode == 0, result.stderr
    assert (site / "flags" / "index.html").is_file()
    assert not list(site.rglob("*.py")), "the hooks must stay out of the site"


def test_flag_reference_lists_every_server_flag(site_build: Build) -> None:
    result, site = site_build
    assert result.returncode == 0, result.stderr
    page = (site / "flags" / "index.html").read_text(encoding="utf-8")
    flags = server_flags()
    missing = [o for a in flags for o in a.option_strings if f"<code>{o}</code>" not in page]
    assert not missing, f"flags missing from the generated page: {missing}"
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    # argparse expands `%` in help texts; take the others verbatim.
    helps = [a.help for a in flags if a.help and "%" not in a.help]
    assert helps
    assert [h for h in helps if h not in text] == []


def test_strict_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    # the hooks' imports and the files the docs link to
    for name in ("python", "benchmark", "results"):
        (tmp_path / name).symlink_to(REPO / name)
    with open(tmp_path / "docs" / "testing.md", "a", encoding="utf-8") as f:
        f.write("\nSee [a page that does not exist](no_such_page.md).\n")
    result = build_site(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "no_such_page.md" in warnings[0], result.stderr
