"""Attention backends, created by name; GPU backends are imported only when chosen."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base import AttentionBackend

_BACKENDS = {
    "cpu_native": "sglang.srt.layers.attention.cpu_native:CpuNativeAttnBackend",
    "torch_native": "sglang.srt.layers.attention.torch_native:TorchNativeAttnBackend",
}


def default_attention_backend(device: str) -> str:
    """The native CPU kernels on a CPU (torch's paths for what they do not take); torch's
    operators elsewhere."""
    return "cpu_native" if device == "cpu" else "torch_native"


def attention_backend_names() -> list[str]:
    return sorted(_BACKENDS)


def create_attention_backend(name: str, **kwargs) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(_BACKENDS)}")
    module_name, cls_name = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)(**kwargs)
