"""Build a model's HF processor without torchvision and without a video processor.

``AutoProcessor`` cannot build e.g. ``Qwen2_5_VLProcessor`` without torchvision because it
also loads the (torchvision-only) video processor. Here the processor is composed by hand:
the PIL image processor (``AutoImageProcessor(backend="pil")`` honours the folder's
``image_processor_type``), ``AutoTokenizer``, the chat template and the processor kwargs from
``processor_config.json``; Qwen processors are wrapped in a subclass whose ``__init__`` takes
no video processor.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import Any

# config.json model_type -> (processor class name in transformers, drop the video processor)
PROCESSOR_REGISTRY: dict[str, tuple[str, bool]] = {
    "qwen2_vl": ("Qwen2VLProcessor", True),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", True),
    "qwen3_vl": ("Qwen3VLProcessor", True),
    "qwen3_vl_moe": ("Qwen3VLProcessor", True),
    "qwen3_5": ("Qwen3VLProcessor", True),
    "qwen3_5_moe": ("Qwen3VLProcessor", True),
    "llava": ("LlavaProcessor", False),
    "gemma3": ("Gemma3Processor", False),
}
_SUBPROCESSOR_ARGS = ("image_processor", "tokenizer", "video_processor", "chat_template")


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


@functools.cache
def _processor_class(name: str, drop_video: bool) -> type:
    import transformers

    base: type = getattr(transformers, name)
    if not drop_video:
        return base

    def __init__(
        self: Any,
        image_processor: Any = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    # ProcessorMixin derives the sub-processor list from the __init__ signature.
    return type(name, (base,), {"__init__": __init__, "__module__": __name__})


def _chat_template(path: Path, tokenizer: Any) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    template = _read_json(path / "chat_template.json").get("chat_template")
    return template or getattr(tokenizer, "chat_template", None)


def load_hf_processor(model_path: str | Path) -> Any:
    """Return the model's HF processor (tokenizer + image processor composed), built without
    torchvision and without a video processor. For text-only models return the tokenizer."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    path = Path(model_path)
    model_type = _read_json(path / "config.json").get("model_type")
    preprocessor = _read_json(path / "preprocessor_config.json")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if model_type not in PROCESSOR_REGISTRY:
        if not preprocessor:
            return tokenizer
        return AutoProcessor.from_pretrained(path)  # unknown family: best effort

    cls = _processor_class(*PROCESSOR_REGISTRY[model_type])
    image_processor = AutoImageProcessor.from_pretrained(path, backend="pil")
    params = inspect.signature(cls.__init__).parameters
    # Processor kwargs (patch_size, image_seq_length, ...): processor_config.json wins over the
    # legacy copies some folders keep in preprocessor_config.json.
    options = {**preprocessor, **_read_json(path / "processor_config.json")}
    kwargs = {k: v for k, v in options.items() if k in params and k not in _SUBPROCESSOR_ARGS}
    return cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=_chat_template(path, tokenizer),
        **kwargs,
    )
