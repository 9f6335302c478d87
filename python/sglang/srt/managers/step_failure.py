"""A failure that belongs to one request of a step, as the scheduler's parts report it."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.core.req import Req


@dataclass(frozen=True)
class StepFailure:
    """``req`` failed inside a step (its inputs, its forward or its sampling). The part that
    found it returns it; ``Scheduler.step`` ends that request alone, with an error."""

    req: Req
    message: str
