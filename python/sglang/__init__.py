"""SGLang-compatible serving engine for vision-language models with chunk-aware ViT caching."""

from typing import TYPE_CHECKING

from sglang.version import __version__

__all__ = ["Engine", "__version__"]

if TYPE_CHECKING:
    from sglang.srt.entrypoints.engine import Engine  # noqa: F401


def __getattr__(name: str):
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(name)
