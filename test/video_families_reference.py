"""What the video-family tests share: the three families' prompt spellings (``SPECS``), test
clips, and HF's side of each comparison: its model inputs for a prompt with one video of
already sampled frames (the placeholder expanded by HF's own ``replace_video_token``) and its
greedy output."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
import transformers
from conftest import model_dir
from transformers.video_utils import VideoMetadata

from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.video_io import load_video
from sglang.srt.multimodal.video_preprocess import VideoSettings, preprocess_frames

MAX_NEW = 6
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


@dataclass(frozen=True)
class Spec:
    video: str  # what a prompt writes for a video
    image: str  # ... and for an image
    turn: str  # a user turn and the assistant's start, with {} for the content
    end: str  # what closes an assistant answer
    groups: int  # cache entries of the test clip (frame groups, or 1 for a whole video)
    rows: int  # embedding rows of the test clip


SPECS = {
    "glm4v": Spec(
        "<|begin_of_video|><|video|><|end_of_video|>",
        "<|begin_of_image|><|image|><|end_of_image|>",
        "<|user|>\n{}<|assistant|>\n",
        "",
        4,
        16,
    ),
    # one pooled row per 28x28 frame (2x2 patches), one cache entry per frame, the newline
    "llava_onevision": Spec(
        "<video>\n",
        "<image>\n",
        "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>\n",
        7,
        8,
    ),
    # four rows per 56x56 frame tile, one cache entry per frame
    "internvl": Spec(
        "<video>\n",
        "<IMG_CONTEXT>\n",
        "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>\n",
        7,
        28,
    ),
}
FAMILIES = tuple(SPECS)
GLM_START = "[gMASK]<sop>"
FIXED_SIZE = ("llava_onevision", "internvl")


def prompt_of(family: str, *turns: str, answers: tuple[str, ...] = ()) -> str:
    spec = SPECS[family]
    head = GLM_START if family == "glm4v" else ""
    text = ""
    for i, turn in enumerate(turns):
        text += spec.turn.format(turn)
        if i < len(answers):
            text += answers[i] + spec.end
    return head + text


def video_prompt(family: str) -> str:
    return prompt_of(family, SPECS[family].video + "What happens in the clip?")


def clip(seed: int, frames: int = 7, height: int = 50, width: int = 70) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), np.uint8)


@functools.cache
def hf_model(family: str):
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        model_dir(family), dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval()


def video_settings(family: str) -> VideoSettings:
    return VideoSettings.from_model_dir(model_dir(family))


def hf_inputs(
    family: str, prompt: str, frames: np.ndarray, images: tuple = ()
) -> dict[str, torch.Tensor]:
    """HF's model inputs for ``prompt`` with one video of already sampled ``frames`` (and
    ``images`` before it, expanded by HF's processor): the video placeholder expanded by HF's
    own ``replace_video_token`` (its video processor stood in for by the settings it reads),
    the video's pixels from ``preprocess_frames`` (checked against HF's video processor in the
    preprocessing tests)."""
    settings = video_settings(family)
    video = load_video(frames, settings)
    features = preprocess_frames(video.frames, settings)
    processor = load_hf_processor(model_dir(family))
    processor.video_processor = SimpleNamespace(merge_size=settings.merge_size)
    inputs: dict = {k: torch.from_numpy(v) for k, v in features.items()}
    if family == "glm4v":
        metadata = VideoMetadata(
            total_num_frames=len(frames), fps=settings.fps, frames_indices=list(range(len(frames)))
        )
        inputs["video_metadata"] = [metadata]
    tokenizer = processor.tokenizer
    # HF's processor expands the images before the video; the rest is tokenized on its own
    # (the video placeholder sits between special tokens or after a word: the same tokens)
    before, after = prompt.split(processor.video_token)
    out: dict = {}
    if images:
        out = dict(processor(text=[before], images=[list(images)], return_tensors="pt"))
        ids = out.pop("input_ids")[0].tolist()
        for key in ("attention_mask", "mm_token_type_ids", "token_type_ids"):
            out.pop(key, None)
    else:
        ids = tokenizer(before)["input_ids"]
    replacement = processor.replace_video_token(inputs, 0)
    ids += tokenizer(replacement + after, add_special_tokens=False)["input_ids"]
    out["input_ids"] = torch.tensor([ids])
    out.update({k: v for k, v in inputs.items() if k != "video_metadata"})
    if family == "glm4v":
        out["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids([ids]))
    if family == "internvl":  # InternVL's processor hands video frames over as image tiles
        tiles = [out["pixel_values"]] if images else []
        out["pixel_values"] = torch.cat([*tiles, out.pop("pixel_values_videos")[0]])
    return out


def hf_video_greedy(family: str, prompt: str, frames: np.ndarray, images: tuple = ()) -> tuple:
    """(HF greedy output ids, their log-probs, prompt ids)."""
    inputs = hf_inputs(family, prompt, frames, images)
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = hf_model(family).generate(
            **inputs,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[0, ids.shape[1] :].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.logits, new)]
    return new, logprobs, ids[0].tolist()
