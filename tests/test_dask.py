"""Merge and analyze on a Dask cluster: a LocalCluster of two worker processes bound to 127.0.0.1."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import layerscope as ls
from layerscope import filemap
from layerscope.cli import main
from layerscope.cli.merge_cmd import _to_dict

sys.path.insert(0, str(Path(__file__).parent))
from fixtures.rank_traces import write_rank_traces

distributed = pytest.importorskip("distributed")

WORLD, SLOW = 6, 4


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    with distributed.Client(cluster, set_as_default=False) as c:
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_rank_traces(tmp_path_factory.mktemp("ranks"), WORLD, SLOW, steps=300)


def test_cluster_merge_equals_local_merge(client: Any, traces: list[Path]) -> None:
    local = ls.merge(traces)
    on_cluster = ls.merge(traces, scheduler=client)
    assert _to_dict(on_cluster) == _to_dict(local)
    assert on_cluster.straggler is not None and on_cluster.straggler.rank == SLOW
    assert on_cluster.straggler.module == "layers.3"
    assert on_cluster.failed == ()


def test_workers_get_paths_not_bytes(client: Any, traces: list[Path]) -> None:
    seen: list[Any] = []
    original = client.map

    def spy(func: Any, *iterables: Any, **kwargs: Any) -> Any:
        seen.extend(iterables[0])
        return original(func, *iterables, **kwargs)

    client.map = spy
    try:
        ls.merge(traces, scheduler=client)
    finally:
        client.map = original
    assert seen == [str(p.resolve()) for p in traces]


def test_a_file_that_always_fails_is_named_and_the_rest_merge(
    client: Any, traces: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "rank-99.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "x"')  # cut mid-event, nothing complete
    merged = ls.merge([*traces, bad], scheduler=client)
    assert [p for p, _ in merged.failed] == [str(bad)]
    assert merged.ranks == tuple(range(WORLD))
    address = client.scheduler.address
    assert main(["merge", *map(str, traces), str(bad), "--scheduler", address, "--ascii"]) == 0
    err = capsys.readouterr().err
    assert f"{bad} left out" in err


def test_a_worker_killed_mid_run_is_retried(
    client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_rank_traces(tmp_path / "big", 8, 5, steps=2500)  # ~0.3 s per file per worker
    before = client.run(os.getpid)
    killed: list[int] = []
    original = filemap.ProgressLine.update

    def kill_a_busy_worker(self: filemap.ProgressLine, done: int, failed: int, final: bool = False) -> None:
        if not killed:
            busy = [w for w, tasks in client.processing().items() if tasks]
            pid = before[busy[0]]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        original(self, done, failed, final)

    monkeypatch.setattr(filemap.ProgressLine, "update", kill_a_busy_worker)
    merged = ls.merge(files, scheduler=client)
    assert killed and killed[0] not in client.run(os.getpid).values()
    assert merged.failed == ()
    assert merged.ranks == tuple(range(8))
    assert merged.straggler is not None and merged.straggler.rank == 5


def test_analyze_folder_on_the_cluster_prints_what_local_prints(
    client: Any, traces: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(traces[0].parent)
    assert main(["analyze", folder, "--ascii", "--depth", "1"]) == 0
    local = capsys.readouterr().out
    assert main(["analyze", folder, "--ascii", "--depth", "1", "--scheduler", client.scheduler.address]) == 0
    assert capsys.readouterr().out == local
    assert local.count("== ") == WORLD


def test_unreachable_scheduler_is_one_line_exit_2(
    traces: list[Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    monkeypatch.setattr(filemap, "CONNECT_TIMEOUT_S", 1.0)

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["merge", *map(str, traces), "--scheduler", f"tcp://127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in err


def test_without_dask_the_option_says_how_to_install(
    traces: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    assert main(["merge", *map(str, traces), "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert "pip install 'layerscope[dask]'" in capsys.readouterr().err


def test_local_merge_names_a_bad_file_too(traces: list[Path], tmp_path: Path) -> None:
    bad = tmp_path / "rank-bad.json"
    bad.write_text("not json at all")
    merged = ls.merge([*traces, bad], workers=2)
    assert [p for p, _ in merged.failed] == [str(bad)]
    assert len(merged.ranks) == WORLD
