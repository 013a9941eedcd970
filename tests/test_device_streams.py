"""Live device spans on their streams (``capture/device_streams.py``): one thread per (device,
stream), as a trace file's reader gives them. The live path itself runs in tests/test_cuda.py."""

from __future__ import annotations

import numpy as np

from layerscope.capture.device_streams import STREAM_TID_BASE, stream_threads


def test_each_stream_gets_one_thread_numbered_as_first_seen() -> None:
    tid = np.array([1, 1, 2, 1, 2, 2, -1])
    rows = np.array([1, 2, 4, 5])  # kernels launched from threads 1 and 2
    threads = stream_threads(tid, np.array([3]), rows, np.array([0, 0, 0, 1]), np.array([13, 7, 13, 7]))
    first, second, third = STREAM_TID_BASE, STREAM_TID_BASE + 1, STREAM_TID_BASE + 2
    assert threads == {first: (0, 13), second: (0, 7), third: (1, 7)}
    assert tid.tolist() == [1, first, second, 1, first, third, -1]  # CPU spans keep their threads


def test_stream_threads_stay_above_every_thread_id_seen() -> None:
    high = STREAM_TID_BASE + 5
    tid = np.array([high, 9])
    threads = stream_threads(tid, np.array([high + 2]), np.array([1]), np.array([0]), np.array([7]))
    assert threads == {high + 3: (0, 7)} and tid.tolist() == [high, high + 3]


def test_no_device_work_leaves_the_threads_alone() -> None:
    tid, none = np.array([1, 2]), np.zeros(0, dtype=np.int64)
    assert stream_threads(tid, none, none, none, none) == {}
    assert tid.tolist() == [1, 2]
