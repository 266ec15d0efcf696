"""A partition file's write-out starts while it is written (the fsync before the put is acknowledged then finds
little left): the kernel accepts each request, made once a step's worth was written since the last."""

from __future__ import annotations

import os

import pytest

from flightpart.io import writeback as wb

pytestmark = pytest.mark.skipif(not wb.WRITEBACK_AVAILABLE, reason="this system has no sync_file_range")


def test_write_out_starts_once_a_step_was_written_since_the_last(tmp_path):
    step = wb.WRITEBACK_STEP
    with open(tmp_path / "p.arrow", "wb", buffering=0) as f:
        started_by = wb.Writeback(f.fileno())
        started = []
        size = 0
        for chunk in (step // 2, step // 2 - 1, 2, 2 * step, 5):
            f.write(os.urandom(chunk))
            size += chunk
            started_by.written(size)
            started.append(started_by.started)
    # nothing before a step was written; then up to the end each time the kernel was asked
    assert started == [0, 0, step + 1, 3 * step + 1, 3 * step + 1]


def test_a_descriptor_the_kernel_refuses_is_not_asked_again():
    started_by = wb.Writeback(-1)
    started_by.written(wb.WRITEBACK_STEP)
    assert started_by.refused and started_by.started == 0
    started_by.written(2 * wb.WRITEBACK_STEP)
    assert started_by.refused and started_by.started == 0
