"""MkDocs hook: the *Server flags* page, generated at build time.

``flags.md`` exists only in the built site. It is rendered from the parser that
``ServerArgs.add_cli_args`` fills, the one ``python -m sglang.launch_server`` parses, so a new
``ServerArgs`` field appears with its default and help text without a docs edit.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

FLAGS_PAGE = "flags.md"
PROG = "python -m sglang.launch_server"
# Python-Markdown's backslash escapes (`|` through the tables extension).
MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]|])")


def server_parser(repo: str) -> argparse.ArgumentParser:
    python_dir = os.path.join(repo, "python")
    if python_dir not in sys.path:
        sys.path.insert(0, python_dir)
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog=PROG, add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def render_flags(parser: argparse.ArgumentParser) -> str:
    lines = [
        "# Server flags",
        "",
        f"Every flag of `{PROG}`, generated from `ServerArgs`",
        "(`python/sglang/srt/server_args.py`) when this site is built.",
        "[Serving](serving.md) shows how they are used.",
        "",
    ]
    # argparse has no public accessor for its groups.
    groups = [(group.title, _documented(group._group_actions)) for group in parser._action_groups]
    groups = [(title, actions) for title, actions in groups if actions]
    for title, actions in groups:
        if len(groups) > 1:
            lines += [f"## {title}", ""]
        lines += ["| Flag | Type | Default | Description |", "|---|---|---|---|"]
        lines += [_flag_row(parser, action) for action in actions]
        lines.append("")
    return "\n".join(lines)


def _documented(actions: list[argparse.Action]) -> list[argparse.Action]:
    return [a for a in actions if a.option_strings and a.help != argparse.SUPPRESS]


def _flag_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    flags = ", ".join(f"`{option}`" for option in action.option_strings)
    cells = [flags, _type_name(action), _default(action.default), _help(parser, action)]
    return "| " + " | ".join(cells) + " |"


def _type_name(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices:
        return "one of " + ", ".join(f"`{choice}`" for choice in action.choices)
    return getattr(action.type, "__name__", "str")


def _default(value: object) -> str:
    return '`""`' if value == "" else f"`{value}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    if text:  # argparse's own expansion: `%%` and `%(default)s`
        text = text % {**vars(action), "prog": parser.prog}
    return MARKDOWN_SPECIALS.sub(r"\\\1", html.escape(text, quote=False))


def on_files(files: Files, config: MkDocsConfig) -> Files:
    repo = os.path.dirname(os.path.abspath(config.config_file_path))
    files.append(File.generated(config, FLAGS_PAGE, content=render_flags(server_parser(repo))))
    return files
