"""A video's frame groups as items of their own, for towers that encode groups independently."""

from __future__ import annotations

from typing import Any

import numpy as np

from sglang.srt.core.mm_item import MultimodalItem, sub_spans
from sglang.srt.models.adapters.base import PixelShape, video_num_groups
from sglang.srt.multimodal.image_io import content_hash


def frame_groups(video: MultimodalItem, frames_per_group: int) -> list[MultimodalItem]:
    """One item per frame group of ``video``: keyed by (video hash, group index), owning its
    slice of the video's placeholder rows and its frames (features are made on a miss). Rows
    after the groups' (LLaVA-OneVision's trailing newline) belong to the last group."""
    count = video_num_groups(video.layout)
    rows = video.group_rows
    tail = video.num_tokens - count * rows
    groups = []
    for g in range(count):
        frames = video.source[g * frames_per_group : (g + 1) * frames_per_group]
        if "video_grid_thw" in video.layout:
            grid = np.asarray(video.layout["video_grid_thw"]).reshape(-1)
            layout: dict[str, Any] = {"video_grid_thw": np.array([[1, grid[1], grid[2]]])}
        else:
            layout = {"pixel_values_videos": PixelShape((1, len(frames), 3, *frames.shape[1:3]))}
        end = (g + 1) * rows + (tail if g == count - 1 else 0)
        key = content_hash(video.hash.to_bytes(8, "little"), g.to_bytes(4, "little"))
        groups.append(
            MultimodalItem(
                key,
                sub_spans(video.spans, g * rows, end),
                layout,
                frames,
                modality="video",
                group_rows=rows,
            )
        )
    return groups
