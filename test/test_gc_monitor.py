"""The compute process's garbage-collection counters and their warning threshold."""

from __future__ import annotations

import gc
import logging
import re

import pytest

from sglang.srt.managers.gc_monitor import GcMonitor
from sglang.srt.server_args import ServerArgs


def test_counts_collections_and_their_time() -> None:
    monitor = GcMonitor()
    try:
        before = monitor.stats()
        gc.collect()
        gc.collect(0)
        after = monitor.stats()
        assert after["collections"] == before["collections"] + 2
        assert after["seconds"] > before["seconds"]
        assert 0 < after["longest_s"] <= after["seconds"]
    finally:
        monitor.close()
    gc.collect()
    assert monitor.stats()["collections"] == after["collections"]  # closed: no longer counts


def test_warns_about_collections_over_the_threshold(caplog) -> None:
    garbage = []
    for _ in range(50_000):  # cycles, so that a full collection has work to do
        node: list = []
        node.append(node)
        garbage.append(node)
    del garbage, node
    slow, quiet = GcMonitor(warning_threshold_s=1e-9), GcMonitor(warning_threshold_s=3600)
    try:
        with caplog.at_level(logging.WARNING, logger="sglang.srt.managers.gc_monitor"):
            gc.collect()
    finally:
        slow.close()
        quiet.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # from the monitor with the tiny threshold only
    match = re.fullmatch(
        r"garbage collection of generation 2 took [\d.]+ s \((\d+) objects collected\)", warnings[0]
    )
    assert match and int(match[1]) >= 50_000


def test_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="gc_warning_threshold_secs"):
        ServerArgs(gc_warning_threshold_secs=-1.0)
