"""Many files at once (issue 39, item 3): ``--jobs N`` reads N files at a time and gives exactly what
one after another gives, in the same order; a bad file is one line; at most N files are worked on
and a bounded number of results wait, whatever the folder's size."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

import layerscope as ls
from layerscope import filemap
from layerscope.cli import main
from layerscope.cli.merge_cmd import _to_dict
from layerscope.errors import LayerscopeWarning
from layerscope.filemap import each_file, jobs_for, map_files, read_all
from layerscope.gcpause import gc_paused
from layerscope.loading import load, rank_critical_path
from layerscope.model.serialize import profile_to_dict

sys.path.insert(0, str(Path(__file__).parent))
from fixtures.rank_traces import write_rank_traces

WORLD, SLOW = 5, 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of synthetic rank traces, one of them gzipped (both readers' inputs in one folder)."""
    folder = tmp_path_factory.mktemp("ranks")
    files = write_rank_traces(folder, WORLD, SLOW, steps=60)
    gz = files[-1].with_name(files[-1].name + ".gz")
    import gzip

    gz.write_bytes(gzip.compress(files[-1].read_bytes()))
    files[-1].unlink()
    return folder


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("source", ["synthetic", "two_ranks"])
def test_analyze_a_folder_with_jobs_gives_the_serial_output(
    source: str, ranks: Path, real_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ranks if source == "synthetic" else real_traces / "two_ranks"
    outputs = []
    for jobs in ("1", "2", "3"):
        saved = tmp_path / f"jobs{jobs}"
        code, out, _ = _cli(["analyze", str(folder), "--ascii", "--jobs", jobs, "-o", str(saved)], capsys)
        assert code == 0
        names = sorted(p.name for p in saved.iterdir())
        profiles = [ls.load(saved / name) for name in names]
        for profile in profiles:
            profile.validate()
        outputs.append((out, names, [profile_to_dict(p) for p in profiles]))
    assert outputs[0][0].count("== ") == len(outputs[0][1]) >= 2  # every trace, in the folder's order
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


def test_merge_with_jobs_is_the_serial_merge(ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    serial = ls.merge(ranks, jobs=1)
    assert serial.straggler is not None and serial.straggler.rank == SLOW
    assert serial.critical_path is not None
    for jobs in (2, 4):
        assert _to_dict(ls.merge(ranks, jobs=jobs)) == _to_dict(serial)
    assert _to_dict(ls.merge(ranks, workers=2)) == _to_dict(serial)  # the former name
    outs = [_cli(["merge", str(ranks), "--ascii", "--jobs", j], capsys)[1] for j in ("1", "2")]
    assert outs[0] == outs[1] and f"rank {SLOW}" in outs[0]


def test_process_and_thread_pools_give_the_same_profiles(ranks: Path) -> None:
    files = sorted(ranks.iterdir())
    serial = map_files(load, files, jobs=1)
    assert len(serial.results) == WORLD and not serial.failures
    for pool in ("threads", "processes"):
        done = map_files(load, files, jobs=2, pool=pool)  # type: ignore[arg-type]
        assert done.paths == serial.paths
        assert [profile_to_dict(p) for p in done.results] == [profile_to_dict(p) for p in serial.results]


def test_rank_critical_path_reads_in_parallel_to_the_same_path(real_traces: Path) -> None:
    files = sorted((real_traces / "two_ranks").iterdir())
    one = rank_critical_path(files, jobs=1)
    assert rank_critical_path(files, jobs=2).to_json() == one.to_json()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_bad_file_is_one_line_and_the_others_are_analysed(
    ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs: str
) -> None:
    for name in ("rank-0.json", "rank-1.json"):
        shutil.copy(ranks / name, tmp_path / name)
    (tmp_path / "rank-0b.json").write_text("not json at all")  # sorts between the two
    code, out, err = _cli(["analyze", str(tmp_path), "--ascii", "--top", "0", "--jobs", jobs], capsys)
    assert code == 1
    assert out.index("rank-0.json") < out.index("rank-1.json") and "rank-0b" not in out
    errors = [line for line in err.splitlines() if line.startswith("layerscope: error:")]
    assert len(errors) == 1 and errors[0].count("rank-0b.json") == 1
    merged = ls.merge(tmp_path, jobs=int(jobs))
    assert [Path(p).name for p, _ in merged.failed] == ["rank-0b.json"] and len(merged.ranks) == 2


def test_a_malformed_event_warns_once_with_any_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import orjson

    from fixtures.rank_traces import rank_trace

    for rank in range(3):
        trace = rank_trace(rank, 3, 1, steps=5)
        if rank == 1:  # no "ts": skipped and counted, one warning naming the file
            trace["traceEvents"].append(
                {"ph": "X", "name": "bad", "cat": "cpu_op", "dur": 1, "pid": 1, "tid": 1}
            )
        (tmp_path / f"rank-{rank}.json").write_bytes(orjson.dumps(trace))
    runs = []
    for jobs in ("1", "3"):
        code, out, err = _cli(["analyze", str(tmp_path), "--ascii", "--top", "0", "--jobs", jobs], capsys)
        assert code == 0
        runs.append((out, [line for line in err.splitlines() if "warning" in line]))
    assert runs[1] == runs[0]
    assert len(runs[0][1]) == 1 and "rank-1.json: skipped 1 malformed event" in runs[0][1][0]


def test_jobs_below_one_is_a_usage_error(ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("analyze", "merge"):
        code, _, err = _cli([command, str(ranks), "--jobs", "0"], capsys)
        assert code == 2 and "--jobs must be at least 1, not 0" in err and err.count("\n") == 1


def test_jobs_default_to_the_usable_cores_and_never_exceed_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filemap, "usable_cores", lambda: 6)
    assert jobs_for(None, 100) == 6 and jobs_for(None, 4) == 4 and jobs_for(3, 100) == 3
    assert jobs_for(8, 0) == 1
    with pytest.raises(ls.UsageError, match="at least 1"):
        jobs_for(0, 5)


class _Tracker:
    """Counts files being worked on, and the most at once; the first file waits for ``release``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = self.most = self.started = 0
        self.release = threading.Event()

    def __call__(self, name: str) -> str:
        with self.lock:
            self.started += 1
            self.active += 1
            self.most = max(self.most, self.active)
        if name == "f0":
            self.release.wait(10)
        time.sleep(0.002)
        with self.lock:
            self.active -= 1
        if name == "f5":
            raise ValueError("bad file\nsecond line")
        return name.upper()


def test_memory_bound_at_most_jobs_at_work_and_a_window_of_results() -> None:
    """While the first file is held, the pool runs ahead by the window (2 x jobs files) and no
    further; at no time are more than ``jobs`` files worked on; order and failures as serial."""
    jobs, paths = 3, [Path(f"f{k}") for k in range(40)]
    tracker = _Tracker()
    outcomes = each_file(tracker, paths, jobs=jobs, pool="threads")  # the window is the same code for both
    first: list[object] = []
    taker = threading.Thread(target=lambda: first.append(next(outcomes)))
    taker.start()
    window = (1 + filemap.AHEAD_PER_JOB) * jobs
    deadline = time.monotonic() + 10
    while tracker.started < window and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # room for any file beyond the window to start (none may)
    assert tracker.started == window and not first
    tracker.release.set()
    taker.join(10)
    rest = list(outcomes)
    got = [*first, *rest]
    assert [p for p, _, _ in got] == paths
    assert got[0] == (Path("f0"), "F0", None) and got[5] == (Path("f5"), None, "ValueError: bad file")
    assert tracker.most <= jobs and tracker.started == len(paths)


def test_the_default_pool_is_jobs_worker_processes(ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, int]] = []
    original = filemap._executor

    def recording(pool: filemap.PoolKind, count: int) -> object:
        made.append((pool, count))
        return original(pool, count)

    monkeypatch.setattr(filemap, "_executor", recording)
    monkeypatch.setattr(filemap, "usable_cores", lambda: 3)
    files = sorted(ranks.iterdir())
    assert len(map_files(load, files).results) == WORLD
    assert len(map_files(load, files, jobs=1).results) == WORLD  # serial: no pool at all
    assert len(map_files(load, files[:2]).results) == 2  # never more jobs than files
    assert made == [("processes", 3), ("processes", 2)]


def test_forked_workers_inherit_the_flop_formulas_only_where_traces_have_shapes(
    ranks: Path, tmp_path: Path
) -> None:
    """``warm_for`` imports torch's FLOP formulas before the workers fork when the first trace
    records shapes (here a gzipped one), and imports nothing for traces without shapes."""
    import gzip
    import json
    import subprocess

    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}
    shaped = tmp_path / "shaped.json.gz"
    shaped.write_bytes(
        gzip.compress(
            json.dumps({"traceEvents": [{**event, "args": {"Input Dims": [[2, 3], [3, 4]]}}]}).encode()
        )
    )
    check = (
        "import sys; from pathlib import Path; from layerscope.loading import warm_for; "
        "warm_for([Path(sys.argv[1])]); print('torch' in sys.modules)"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    for path, expected in ((shaped, "True"), (sorted(ranks.iterdir())[0], "False")):
        done = subprocess.run(
            [sys.executable, "-c", check, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": src},
        )
        assert done.stdout.strip() == expected


def _dies_on_f3(name: str) -> str:
    if name == "f3":
        os._exit(9)  # as the kernel's OOM killer would end it
    return name


def test_a_worker_that_dies_costs_only_its_own_file() -> None:
    """A worker killed mid-file breaks the whole pool: the files not yet handed over are read again
    one at a time, each in a fresh worker if the one before died, and only the file that kills its
    worker even alone is reported, in the files' order."""
    paths = [Path(f"f{k}") for k in range(6)]
    with pytest.warns(LayerscopeWarning, match="worker process died while 2 files .* one at a time"):
        outcomes = list(each_file(_dies_on_f3, paths, jobs=2, pool="processes"))
    assert [path for path, _, _ in outcomes] == paths
    assert [result for _, result, _ in outcomes] == ["f0", "f1", "f2", None, "f4", "f5"]
    assert [why for _, _, why in outcomes][3] == "the worker process reading it died (killed: out of memory?)"
    assert [why for k, (_, _, why) in enumerate(outcomes) if k != 3] == [None] * 5


def _warns(name: str) -> str:
    import warnings

    warnings.warn(f"{name}: something odd", LayerscopeWarning, stacklevel=1)
    return name


def test_worker_warnings_are_shown_here_in_the_files_order() -> None:
    """A worker process's warnings come back with its result and are shown here, file by file, as
    the serial run shows them (and through this process's filters)."""
    import warnings

    paths = [Path(f"f{k}") for k in range(5)]
    runs = []
    for jobs, pool in ((1, None), (3, "processes")):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert [r for _, r, _ in each_file(_warns, paths, jobs=jobs, pool=pool)] == [
                p.name for p in paths
            ]
        # ours only: Python 3.12+ adds a DeprecationWarning of its own when the pool forks a
        # multi-threaded process
        runs.append([str(w.message) for w in seen if issubclass(w.category, LayerscopeWarning)])
    assert runs[0] == runs[1] == [f"f{k}: something odd" for k in range(5)]


def test_closing_early_starts_nothing_more() -> None:
    tracker = _Tracker()
    tracker.release.set()
    outcomes = each_file(tracker, [Path(f"f{k}") for k in range(50)], jobs=2, pool="threads")
    assert next(outcomes)[1] == "F0"
    outcomes.close()
    assert tracker.started <= 1 + 2 * 2 and tracker.active == 0


def test_read_all_keeps_order_and_raises_the_first_failure_as_it_was() -> None:
    def read(path: Path) -> str:
        time.sleep(0.01 if path.name == "a" else 0)
        if path.name in ("c", "e"):
            raise KeyError(path.name)
        return path.name

    assert read_all(read, [Path(n) for n in "abd"], jobs=3) == ["a", "b", "d"]
    with pytest.raises(KeyError, match="c"):
        read_all(read, [Path(n) for n in "abcde"], jobs=2)


def test_gc_pause_is_shared_by_threads() -> None:
    """Files read in parallel each pause the collector: it stays paused until the last one is done,
    then is as it was."""
    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with gc_paused():
        thread.start()
        inside.wait(10)
    assert not gc.isenabled()  # the other thread's read still runs
    leave.set()
    thread.join(10)
    assert gc.isenabled()
