"""Reading HF's code: a native kernel stands in for an HF function or forward only where that
code is, by its syntax tree, the definition the kernel computes (docstrings and decorators
aside, the argument names normalised)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable


def definition(function: Callable) -> ast.FunctionDef | None:
    """The syntax tree of ``function``'s definition, or None where its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, ast.FunctionDef) else None


def body_code(node: ast.FunctionDef, renames: dict[str, str] | None = None) -> str:
    """The statements of ``node`` as code, without its docstring, each name of ``renames``
    replaced (``{"hidden_states": "x"}``: the same body under another argument name)."""
    statements = [s for s in node.body if not _is_docstring(s)]
    module = ast.Module(body=statements, type_ignores=[])
    if renames:
        module = _Rename(renames).visit(module)
    return ast.unparse(module)


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


class _Rename(ast.NodeTransformer):
    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.renames.get(node.id, node.id), node.ctx)
