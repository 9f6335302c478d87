"""Qwen-VL video preprocessing without torchvision, equal to HF's ``Qwen2VLVideoProcessor``
(Qwen2-VL, Qwen2.5-VL) and ``Qwen3VLVideoProcessor`` (Qwen3-VL).

HF's Qwen2-VL transform, for one video of n frames (uint8, channels first):

1. frame sampling (when asked): ``n = total / native_fps * fps``, clamped to
   [min_frames, min(max_frames, total)] and floored to a multiple of ``temporal_patch_size``;
   indices ``arange(0, total, total / n)`` truncated;
2. ``smart_resize`` of every frame to one size (the video's pixel bounds; with
   ``cap_pixels_per_frame`` the upper bound shares a token budget between the frames);
3. torchvision's bicubic antialiased resize, which on a CPU uint8 tensor is torch's own
   ``interpolate(..., mode="bicubic", antialias=True)`` on uint8 (no float round trip);
4. float32, minus ``mean / rescale_factor``, divided by ``std / rescale_factor``;
5. the last frame repeated up to a multiple of ``temporal_patch_size``, then one row per
   (frame group, merged block, patch) with channel x time x patch pixels.

Qwen3-VL differs in steps 1-2 only: it keeps ``round(linspace(0, total - 1, n))`` with
``n = int(total / native_fps * fps)`` clamped to [min_frames, min(max_frames, total)] (not
floored: step 5 pads), and its ``smart_resize`` bounds the pixels of a frame group (t x h x w),
scaling frames smaller than a patch block up first.

Every step before 5 is per frame, and step 5 cuts the video into independent frame groups, so
a frame group can be preprocessed alone from its frames: that is what per-group encoding uses.
The resize (steps 2-3) runs where the video is decoded; ``preprocess_frames`` does 4-5.

GLM-4.1V's ``Glm4vVideoProcessor`` is Qwen3-VL's transform with its own sampling (``fps`` frames
per second of the first ``max_duration`` seconds, each index ``ceil(i * native_fps / fps)``,
deduplicated, the last repeated to an even count). LLaVA-OneVision's and InternVL's video
processors are HF's base transform: every frame resized to one fixed ``height`` x ``width``
(the same torchvision resize), rescaled and normalised, with no patch layout; their sampling is
HF's uniform ``num_frames`` (InternVL's shifted by half a step). Those frames are independent of
each other: a "frame group" is one frame.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_FPS = 2.0  # Qwen's sampling rate (qwen-vl-utils) when the folder names none
QWEN3_RULE = "qwen3_vl"
GLM4V_RULE = "glm4v"
LLAVA_ONEVISION_RULE = "llava_onevision"
INTERNVL_RULE = "internvl"
# Rules whose frames become a grid of patches (Qwen's layout); the others resize every frame to
# one fixed size.
GRID_RULES = ("qwen2_vl", QWEN3_RULE, GLM4V_RULE)
# model_type -> rule, for folders whose video processor config does not name its class
_RULE_OF_MODEL = {
    "qwen3_vl": QWEN3_RULE,
    "qwen3_vl_moe": QWEN3_RULE,
    "qwen3_5": QWEN3_RULE,
    "qwen3_5_moe": QWEN3_RULE,
    "glm4v": GLM4V_RULE,
    "llava_onevision": LLAVA_ONEVISION_RULE,
    "internvl": INTERNVL_RULE,
}
_RULE_OF_PROCESSOR = {
    "Qwen3VL": QWEN3_RULE,
    "Glm4v": GLM4V_RULE,
    "LlavaOnevision": LLAVA_ONEVISION_RULE,
    "InternVL": INTERNVL_RULE,
}
# Qwen3VLVideoProcessor's class defaults where they differ from Qwen2-VL's.
_QWEN3_DEFAULTS: dict[str, Any] = {
    "min_pixels": 128 * 32 * 32,
    "max_pixels": 32 * 32 * 768,
    "patch_size": 16,
    "image_mean": (0.5, 0.5, 0.5),
    "image_std": (0.5, 0.5, 0.5),
    "max_video_tokens": 768,
}
# Class defaults of the other video processors where they differ from Qwen2-VL's; ``num_frames``
# where HF's class has none (it would keep every frame): the frame counts their model cards use.
_RULE_DEFAULTS: dict[str, dict[str, Any]] = {
    QWEN3_RULE: _QWEN3_DEFAULTS,
    GLM4V_RULE: {"min_pixels": 112 * 112, "max_pixels": 28 * 28 * 2 * 30000},
    LLAVA_ONEVISION_RULE: {"height": 384, "width": 384, "num_frames": 32},
    INTERNVL_RULE: {"height": 384, "width": 384, "num_frames": 8},
}


@dataclass(frozen=True)
class VideoSettings:
    """A Qwen2-VL video processor's options (its class defaults, then the folder's config)."""

    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 28 * 28 * 768
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = _CLIP_MEAN
    image_std: tuple[float, ...] = _CLIP_STD
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    fps: float = DEFAULT_FPS
    min_frames: int = 4
    max_frames: int = 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    rule: str = "qwen2_vl"  # which processor's sampling and resize rules apply
    max_duration: float = 300.0  # GLM-4.1V: seconds sampled at ``fps``, then spread
    height: int = 0  # fixed-size rules: every frame's size
    width: int = 0
    num_frames: int | None = None  # fixed-size rules: frames kept (else ``fps``)
    initial_shift: bool | float = True  # InternVL: offset of the first kept frame
    resample: int = 3  # PIL's numbering: 2 bilinear, 3 bicubic

    @classmethod
    def from_dict(cls, config: dict[str, Any], model_type: str | None = None) -> VideoSettings:
        size = config.get("size") or {}
        kind = str(config.get("video_processor_type", ""))
        rule = next((r for k, r in _RULE_OF_PROCESSOR.items() if kind.startswith(k)), None)
        rule = rule or _RULE_OF_MODEL.get(model_type or "", "qwen2_vl")
        sized = {
            "min_pixels": size.get("shortest_edge"),
            "max_pixels": size.get("longest_edge"),
            "height": size.get("height"),
            "width": size.get("width"),
        }
        given = {name: config.get(name) for name in cls.__dataclass_fields__} | sized
        values: dict[str, Any] = {
            **_RULE_DEFAULTS.get(rule, {}),
            **{k: v for k, v in given.items() if v is not None},
            "rule": rule,
        }
        for name in ("image_mean", "image_std"):
            if name in values:
                values[name] = tuple(float(x) for x in _per_channel(values[name]))
        return cls(**values)

    @classmethod
    def from_model_dir(cls, path: str | Path) -> VideoSettings:
        """``video_preprocessor_config.json``, else the image processor's config (which HF's
        video processor falls back to)."""
        folder = Path(path)
        model = folder / "config.json"
        model_type = json.loads(model.read_text()).get("model_type") if model.is_file() else None
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            file = folder / name
            if file.is_file():
                return cls.from_dict(json.loads(file.read_text()), model_type)
        return cls.from_dict({}, model_type)

    def with_options(self, options: dict[str, Any] | None) -> VideoSettings:
        """These settings with a request's sampling options (``fps``, ``max_frames``, and
        ``num_frames`` where the rule samples a frame count), bounded; ValueError naming the
        option otherwise. ``fps`` replaces a default ``num_frames``."""
        if not options:
            return self
        if not isinstance(options, dict):
            raise ValueError("video options (mm_processor_kwargs) must be an object")
        allowed = REQUEST_OPTIONS.get(self.rule, ("fps", "max_frames"))
        changes: dict[str, Any] = {}
        for name, value in options.items():
            if name not in allowed:
                raise ValueError(
                    f"unknown video option {name!r}: this model's video sampling takes "
                    f"{', '.join(allowed)}"
                )
            changes[name] = _bounded_option(name, value)
        if "fps" in changes and "num_frames" not in changes and not self.grid:
            changes["num_frames"] = None
        return replace(self, **changes)

    def digest(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def grid(self) -> bool:
        """Frames become a patch grid in groups of ``temporal_patch_size`` (Qwen, GLM)."""
        return self.rule in GRID_RULES

    @property
    def frames_per_group(self) -> int:
        return self.temporal_patch_size if self.grid else 1

    @property
    def min_frames_kept(self) -> int:
        """Frames a video needs: a whole frame group where the size rule counts frames."""
        return self.temporal_patch_size if self.rule in (QWEN3_RULE, GLM4V_RULE) else 1


# Per-request sampling options, by rule (GLM-4.1V's sampling has no frame cap), and bounds.
REQUEST_OPTIONS = {
    GLM4V_RULE: ("fps",),
    LLAVA_ONEVISION_RULE: ("fps", "num_frames", "max_frames"),
    INTERNVL_RULE: ("fps", "num_frames", "max_frames"),
}
MAX_REQUEST_FPS = 60.0
MAX_REQUEST_FRAMES = 2048


def _bounded_option(name: str, value: Any) -> float | int:
    if name == "fps":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and 0 < value <= MAX_REQUEST_FPS):
            raise ValueError(f"video option fps must be a number in (0, {MAX_REQUEST_FPS:g}]")
        return float(value)
    if not (isinstance(value, int) and not isinstance(value, bool)):
        raise ValueError(f"video option {name} must be an integer")
    if not 1 <= value <= MAX_REQUEST_FRAMES:
        raise ValueError(f"video option {name} must be in [1, {MAX_REQUEST_FRAMES}]")
    return value


def _per_channel(value: Any) -> list[float]:
    return list(value) if isinstance(value, (list, tuple)) else [float(value)] * 3


def sample_indices(total_frames: int, native_fps: float, settings: VideoSettings) -> np.ndarray:
    """The frame indices HF's ``sample_frames`` keeps when sampling at ``settings.fps``; empty
    when the video has too few frames for one frame group."""
    if settings.rule == QWEN3_RULE:
        return _qwen3_indices(total_frames, native_fps, settings)
    if settings.rule == GLM4V_RULE:
        return _glm4v_indices(total_frames, native_fps, settings)
    if not settings.grid:
        return _uniform_indices(total_frames, native_fps, settings)
    temporal = settings.temporal_patch_size
    max_frames = math.floor(min(settings.max_frames, total_frames) / temporal) * temporal
    wanted = total_frames / native_fps * settings.fps
    wanted = min(max(wanted, settings.min_frames), max_frames, total_frames)
    count = math.floor(wanted / temporal) * temporal
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    return torch.arange(0, total_frames, total_frames / count).int().numpy().astype(np.int64)


def _qwen3_indices(total_frames: int, native_fps: float, s: VideoSettings) -> np.ndarray:
    count = int(total_frames / native_fps * s.fps)
    count = min(max(count, s.min_frames), s.max_frames, total_frames)
    if total_frames < s.temporal_patch_size or count <= 0:
        return np.empty(0, dtype=np.int64)
    return np.linspace(0, total_frames - 1, count).round().astype(np.int64)


def _glm4v_indices(total_frames: int, native_fps: float, s: VideoSettings) -> np.ndarray:
    """``Glm4vVideoProcessor.sample_frames`` (its duration: frames over the frame rate)."""
    last = total_frames - 1
    duration = total_frames / native_fps
    if duration <= s.max_duration:
        count = max(math.floor(duration * s.fps), 1)
        indices = [min(last, math.ceil(i * native_fps / s.fps)) for i in range(count)]
    else:
        count = int(s.max_duration * s.fps)
        if count >= total_frames:
            indices = list(range(total_frames))
        else:
            seconds = np.linspace(0, duration, count, endpoint=True)
            indices = [min(last, math.ceil(t * native_fps)) for t in seconds]
    kept = list(dict.fromkeys(indices))
    if len(kept) % 2:
        kept.append(kept[-1])
    return np.array(kept, dtype=np.int64)


def _uniform_indices(total_frames: int, native_fps: float, s: VideoSettings) -> np.ndarray:
    """HF's uniform sampling of ``num_frames`` (else ``fps`` frames per second) frames, at most
    every frame and ``max_frames``: the base video processor's ``arange(n) * total // n``,
    InternVL's ``arange(shift, total, total / n)`` with a shift of half a step."""
    count = s.num_frames if s.num_frames else int(total_frames / native_fps * s.fps)
    count = min(max(count, 1), total_frames, s.max_frames)
    if s.rule != INTERNVL_RULE:
        return np.arange(count, dtype=np.int64) * total_frames // count
    shift = total_frames / count / 2 if s.initial_shift is True else float(s.initial_shift)
    return torch.arange(shift, total_frames, total_frames / count).int().numpy().astype(np.int64)


def resized_size(num_frames: int, height: int, width: int, s: VideoSettings) -> tuple[int, int]:
    """(height, width) every frame of the video is resized to."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    if not s.do_resize:
        return height, width
    if not s.grid:
        return s.height, s.width
    if s.rule in (QWEN3_RULE, GLM4V_RULE):
        return _qwen3_resized_size(num_frames, height, width, s)
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame:
        total_pixels = int(s.max_video_tokens * s.factor * s.factor * 0.9)
        budget = total_pixels * s.temporal_patch_size // num_frames
        max_pixels = max(min(max_pixels, budget), int(s.min_pixels * 1.05))
    return smart_resize(height, width, s.factor, min_pixels=s.min_pixels, max_pixels=max_pixels)


def _qwen3_resized_size(
    num_frames: int, height: int, width: int, s: VideoSettings
) -> tuple[int, int]:
    """Qwen3-VL's (and GLM-4.1V's) size rule: the pixels of ``num_frames`` frames (rounded to
    whole groups) within [min_pixels, max_pixels]; frames narrower than a patch block are scaled
    up first."""
    factor, temporal = s.factor, s.temporal_patch_size
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame and s.rule == QWEN3_RULE:
        frame_cap = s.max_video_tokens * factor * factor
        per_frame = max(min(frame_cap, s.max_pixels // num_frames), int(s.min_pixels * 1.05))
        max_pixels = per_frame * num_frames
    if num_frames < temporal:
        raise ValueError(f"{num_frames} frame(s) are fewer than a frame group ({temporal})")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError("the video's aspect ratio is over 200")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < s.min_pixels:
        beta = math.sqrt(s.min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


_RESAMPLE = {2: "bilinear", 3: "bicubic"}


def resize_frames(frames: np.ndarray, size: tuple[int, int], resample: int = 3) -> np.ndarray:
    """(n, H, W, 3) uint8 frames resized to ``size`` as torchvision resizes a uint8 video on
    the CPU (bicubic or bilinear, antialiased, no float round trip); unchanged when the size is
    theirs."""
    if frames.shape[1:3] == tuple(size):
        return frames
    if resample not in _RESAMPLE:
        raise ValueError(f"video resample {resample} is not bilinear (2) or bicubic (3)")
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
    out = torch.nn.functional.interpolate(
        video, size=list(size), mode=_RESAMPLE[resample], align_corners=False, antialias=True
    )
    return out.permute(0, 2, 3, 1).contiguous().numpy()


def preprocess_frames(frames: np.ndarray, s: VideoSettings) -> dict[str, np.ndarray]:
    """``{"pixel_values_videos", "video_grid_thw"}`` of resized (n, h, w, 3) uint8 frames, as
    HF's processor gives them for a video of these frames (or for one frame group of it);
    fixed-size rules: ``{"pixel_values_videos"}`` (1, n, 3, h, w). Element-wise float32 numpy
    (the same IEEE operations as torch's, without a thread pool wake-up per small frame group)."""
    video = _rescale_and_normalize(np.asarray(frames).transpose(0, 3, 1, 2), s)
    if not s.grid:
        return {"pixel_values_videos": np.ascontiguousarray(video[None])}
    num_frames, channel, height, width = video.shape
    temporal, patch, merge = s.temporal_patch_size, s.patch_size, s.merge_size
    if pad := -num_frames % temporal:
        video = np.concatenate([video, np.repeat(video[-1:], pad, axis=0)])
        num_frames += pad
    grid_t, grid_h, grid_w = num_frames // temporal, height // patch, width // patch
    patches = video.reshape(
        grid_t, temporal, channel, grid_h // merge, merge, patch, grid_w // merge, merge, patch
    )
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w, channel * temporal * patch * patch)
    return {
        "pixel_values_videos": np.ascontiguousarray(flat),
        "video_grid_thw": np.array([[grid_t, grid_h, grid_w]], dtype=np.int64),
    }


def _rescale_and_normalize(video: np.ndarray, s: VideoSettings) -> np.ndarray:
    """HF's fused rescale + normalize: mean and std divided by the rescale factor in float32
    (as torch computes them), then ``(x - mean) / std`` on the float32 values."""
    video = video.astype(np.float32)
    if s.do_normalize:
        mean, std = _scaled_mean_std(s.image_mean, s.image_std, s.rescale_factor, s.do_rescale)
        video -= mean
        video /= std
        return video
    if s.do_rescale:
        return (torch.from_numpy(video) * s.rescale_factor).numpy()
    return video


@functools.lru_cache(maxsize=16)
def _scaled_mean_std(
    mean: tuple[float, ...], std: tuple[float, ...], rescale_factor: float, do_rescale: bool
) -> tuple[np.ndarray, np.ndarray]:
    scale = 1.0 / rescale_factor if do_rescale else 1.0
    scaled = [(torch.tensor(v) * scale).numpy().reshape(-1, 1, 1) for v in (mean, std)]
    return scaled[0], scaled[1]
