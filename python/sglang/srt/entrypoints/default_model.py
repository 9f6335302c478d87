"""The model served when no model path is given: the OCR reader.

A 6 M-parameter Qwen2-VL trained from scratch on rendered text (``benchmark.train_reader``,
``docs/ocr_reader.md``): it reads short printed text drawn like its training data (a word, a
number, a line of a document, a receipt's value; DejaVu faces on plain light backgrounds) and
answers nothing else; text drawn otherwise it mostly misreads. Its 12 MB checkpoint ships in
the package (``sglang/default_model``), so the engine and the server start with no model hub or
network.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "default_model"
DESCRIPTION = "the embedded OCR reader: reads short printed text on plain backgrounds"


def default_model_path() -> Path:
    """The packaged folder of the default model."""
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the embedded default model is missing from {DEFAULT_MODEL_DIR} (a broken install?); "
            "pass --model-path"
        )
    return DEFAULT_MODEL_DIR


def resolve_model_path(model_path: str | None) -> str:
    """``model_path``, or the default model's folder when it is None."""
    if model_path is not None:
        return model_path
    return str(default_model_path())


def description(model_path: str | None) -> str | None:
    """What the served model does, where the engine knows it (the embedded default)."""
    if model_path is None or Path(model_path).resolve() != DEFAULT_MODEL_DIR:
        return None
    return DESCRIPTION
