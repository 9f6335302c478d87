"""A copy of a model folder that ``transformers serve`` can load.

``transformers serve`` builds the processor with ``AutoProcessor``, which for the Qwen-VL family
also wants the torchvision-only video processor. The copy (symlinks to the original files) adds
an image-only processor subclass registered through ``auto_map``; serve it with
``--trust-remote-code``. The request's ``model`` must then be the copy's path.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

BASES = {
    "qwen2_vl": "Qwen2VLProcessor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
    "qwen3_vl": "Qwen3VLProcessor",
}
_SOURCE = '''"""Image-only {base}: lets AutoProcessor load without torchvision."""

from transformers import {base}


class PeerProcessor({base}):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
'''


def hf_serve_folder(model_path: str | Path, root: str | Path | None = None) -> Path:
    src = Path(model_path).resolve()
    model_type = json.loads((src / "config.json").read_text())["model_type"]
    if model_type not in BASES:
        return src
    base = Path(root or os.environ.get("PEER_MODELS", Path(tempfile.gettempdir()) / "peer-models"))
    out = base / f"{src.name}-hfserve"
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = out / f.name
        if f.name in ("processor_config.json", "preprocessor_config.json") or link.exists():
            continue
        link.symlink_to(f)
    pre = json.loads((src / "preprocessor_config.json").read_text())
    proc = {
        "processor_class": "PeerProcessor",
        "auto_map": {"AutoProcessor": "processing_peer.PeerProcessor"},
    }
    if (src / "processor_config.json").exists():
        proc = {**json.loads((src / "processor_config.json").read_text()), **proc}
    (out / "preprocessor_config.json").write_text(json.dumps({**pre, **proc}, indent=2))
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2))
    (out / "processing_peer.py").write_text(_SOURCE.format(base=BASES[model_type]))
    return out
