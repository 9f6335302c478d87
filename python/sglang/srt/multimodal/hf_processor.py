"""Build a model's HF processor without torchvision and without a video processor.

``AutoProcessor`` cannot build e.g. ``Qwen2_5_VLProcessor`` or ``InternVLProcessor`` without
torchvision because it also loads the (torchvision-only) video processor. Here every processor
is composed by hand: the class named by the folder (``processor_class``) or by transformers'
auto mapping for its ``model_type``, the PIL image processor (``AutoImageProcessor(backend=
"pil")`` honours the folder's ``image_processor_type``), ``AutoTokenizer``, the chat template and
the processor kwargs from ``processor_config.json``. A processor that takes a video processor or
an audio feature extractor (Gemma 4) is wrapped in a subclass whose ``__init__`` takes neither.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

# Sub-processors never built here (video needs torchvision; audio is not served): passed as None.
_UNBUILT_SUBPROCESSORS = ("video_processor", "feature_extractor")
_SUBPROCESSOR_ARGS = ("image_processor", "tokenizer", "chat_template", *_UNBUILT_SUBPROCESSORS)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def processor_class_name(model_path: str | Path) -> str | None:
    """The processor class of a model folder: its own ``processor_class``, else transformers'
    mapping for its ``model_type``."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    path = Path(model_path)
    for name in ("processor_config.json", "preprocessor_config.json"):
        cls = _read_json(path / name).get("processor_class")
        if cls:
            return cls
    model_type = _read_json(path / "config.json").get("model_type")
    return PROCESSOR_MAPPING_NAMES.get(model_type)


def _import_processor_class(name: str) -> type:
    """``transformers.<name>``; where its module imports a helper from the torchvision image
    processor module (Pixtral), that module is stood in for by the PIL one, which defines the
    same helpers."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    cls = getattr(transformers, name)
    if not getattr(cls, "_backends", None):  # else a placeholder for a missing backend
        return cls
    for model_type, class_name in PROCESSOR_MAPPING_NAMES.items():
        package = f"transformers.models.{model_type}"
        if (
            class_name != name
            or importlib.util.find_spec(f"{package}.processing_{model_type}") is None
        ):
            continue
        torchvision_module = f"{package}.image_processing_{model_type}"
        saved = sys.modules.get(torchvision_module)
        sys.modules[torchvision_module] = importlib.import_module(
            f"{package}.image_processing_pil_{model_type}"
        )
        try:
            return getattr(importlib.import_module(f"{package}.processing_{model_type}"), name)
        finally:
            if saved is None:
                del sys.modules[torchvision_module]
            else:
                sys.modules[torchvision_module] = saved
    raise ImportError(f"processor class {name} cannot be imported without torchvision")


@functools.cache
def _processor_class(name: str) -> type:
    base: type = _import_processor_class(name)
    params = inspect.signature(base.__init__).parameters
    unbuilt = {arg: None for arg in _UNBUILT_SUBPROCESSORS if arg in params}
    if not unbuilt:
        return base

    def __init__(
        self: Any,
        image_processor: Any = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        base.__init__(
            self,
            image_processor=image_processor,
            tokenizer=tokenizer,
            chat_template=chat_template,
            **unbuilt,
            **kwargs,
        )

    # ProcessorMixin derives the sub-processor list from the __init__ signature; the processor's
    # own __init__ hands the unbuilt ones on to ProcessorMixin, which _drop_unbuilt filters out.
    bases = (base, _drop_unbuilt())
    namespace: dict[str, Any] = {"__init__": __init__, "__module__": __name__}
    if "video_processor" in unbuilt and "self.video_processor." in inspect.getsource(base.__init__):
        # A processor that reads its video processor's settings when built (MiniCPM-V 4.6 / 4.7:
        # slice and downsample modes) reads the image processor's: no video is processed here.
        namespace["video_processor"] = property(lambda self: self.image_processor)
    return type(name, bases, namespace)


@functools.cache
def _drop_unbuilt() -> type:
    """A ProcessorMixin subclass that, placed after a processor class in the MRO, drops the
    sub-processors passed as None before ProcessorMixin checks its arguments."""
    from transformers.processing_utils import ProcessorMixin

    class DropUnbuilt(ProcessorMixin):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for arg in _UNBUILT_SUBPROCESSORS:
                if arg in kwargs and kwargs[arg] is None:
                    del kwargs[arg]
            # Processors that hand their sub-processors on positionally (Video-LLaVA,
            # LLaVA-NeXT-Video) pass the unbuilt ones as None among them.
            args = tuple(arg for arg in args if arg is not None)
            super().__init__(*args, **kwargs)

    return DropUnbuilt


def _chat_template(path: Path, tokenizer: Any) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    template = _read_json(path / "chat_template.json").get("chat_template")
    return template or getattr(tokenizer, "chat_template", None)


def load_hf_processor(model_path: str | Path) -> Any:
    """Return the model's HF processor (tokenizer + image processor composed), built without
    torchvision and without a video processor. For text-only models return the tokenizer."""
    from transformers import AutoImageProcessor, AutoTokenizer

    path = Path(model_path)
    preprocessor = _read_json(path / "preprocessor_config.json")
    tokenizer = AutoTokenizer.from_pretrained(path)
    is_vlm = preprocessor or "vision_config" in _read_json(path / "config.json")
    name = processor_class_name(path) if is_vlm else None
    if name is None:
        return tokenizer
    cls = _processor_class(name)
    image_processor = AutoImageProcessor.from_pretrained(path, backend="pil")
    base = cls.__mro__[1] if cls.__module__ == __name__ else cls
    params = inspect.signature(base.__init__).parameters
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
