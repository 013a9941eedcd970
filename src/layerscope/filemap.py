"""Run one function per file (a trace or saved profile) and collect the small results: in local
processes, or on a Dask cluster whose workers read the files by path.

The per-file work (read a trace, reduce it to its Profile) is independent and its result is small,
so many ranks are a map on workers and a reduce in this process. Only paths travel to the workers and
only results travel back; the raw trace bytes never pass through this process. A file whose work
fails (on every retry, under Dask) is reported with its reason and left out; the rest go on.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from layerscope.errors import LayerscopeError, UsageError

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

    from distributed import Client

R = TypeVar("R")

#: How often Dask re-runs a file whose work raised before the file counts as failed. A worker that
#: dies mid-file is handled by Dask itself: the file is re-run elsewhere (up to the scheduler's
#: ``allowed-failures``), then counted as failed with ``KilledWorker``.
DASK_RETRIES = 2
#: Seconds to wait for the scheduler before giving up (Dask keeps retrying a refused connection).
CONNECT_TIMEOUT_S = 10.0
DASK_INSTALL_HINT = "--scheduler needs Dask distributed: pip install 'layerscope[dask]'"

#: What runs several files at once here: threads of this process, or worker processes.
PoolKind = Literal["threads", "processes"]
#: The pool ``jobs`` > 1 uses by default: processes. Threads would share the imports and pickle
#: nothing, but only the native reader's scan (and ``.json.gz``'s inflating) releases the GIL: ~18%
#: of a load's CPU time, so threads gain at most ~1.1x on two cores and ~1.2x on any number, while
#: each process runs attribution too, and pickling its Profile back costs ~3-6% of the load
#: (docs/benchmarks.md, "Many files"; benchmarks/many_files.py).
LOCAL_POOL: PoolKind = "processes"
#: Results finished ahead of the one handed over next, per job: the pool runs ahead of a slow file by
#: this much, and no further (the bound on what waits in memory besides the files being read).
AHEAD_PER_JOB = 1


@dataclass(frozen=True)
class FileResults(Generic[R]):
    """Results in the order of the input paths (failed files left out), and the failures."""

    paths: tuple[Path, ...]  # the files that succeeded, in input order
    results: tuple[R, ...]
    failures: tuple[tuple[Path, str], ...]  # (file, one-line reason), in input order


class ProgressLine:
    """``layerscope: <what> 12/64 files (1 failed)`` on stderr, at most once a second, and a last line.

    Quiet for runs under ``quiet_s`` seconds unless something failed, so short merges print nothing.
    """

    def __init__(self, what: str, total: int, quiet_s: float = 2.0) -> None:
        self.what, self.total, self.quiet_s = what, total, quiet_s
        self.started = self.last = time.monotonic()
        self.shown = False

    def update(self, done: int, failed: int, final: bool = False) -> None:
        """Report ``done`` of ``total`` files finished, ``failed`` of them failed."""
        now = time.monotonic()
        quiet = now - self.started < self.quiet_s
        if final:
            if not (self.shown or failed):
                return
        elif quiet or now - self.last < 1.0:
            return
        self.last, self.shown = now, True
        failures = f" ({failed} failed)" if failed else ""
        print(f"layerscope: {self.what} {done}/{self.total} files{failures}", file=sys.stderr, flush=True)


def map_files(
    func: Callable[[str], R],
    paths: Sequence[Path],
    scheduler: str | Client | None = None,
    jobs: int | None = None,
    what: str = "read",
    pool: PoolKind | None = None,
    prepare: Callable[[], object] | None = None,
) -> FileResults[R]:
    """``func(str(path))`` for every path: on the Dask cluster at ``scheduler`` (an address such as
    ``tcp://host:8786``, or a ``distributed.Client``), else here, ``jobs`` files at a time (default:
    the usable cores; 1: one after another in this thread) in a pool of ``pool`` (default
    :data:`LOCAL_POOL`; ``prepare``: see :func:`each_file`). Results come in input order whatever
    the pool. Under Dask or in a process pool ``func`` must be importable by the workers."""
    progress = ProgressLine(what, len(paths))
    if scheduler is not None:
        outcomes = _on_dask(func, paths, scheduler, progress)
    else:
        outcomes = []
        failed = 0
        for _, result, err in each_file(func, paths, jobs, pool, prepare):
            outcomes.append((result, err))
            failed += err is not None
            progress.update(len(outcomes), failed)
    ok = [(p, r) for p, (r, err) in zip(paths, outcomes, strict=True) if err is None]
    failures = tuple((p, err) for p, (_, err) in zip(paths, outcomes, strict=True) if err is not None)
    progress.update(len(paths), len(failures), final=True)
    return FileResults(tuple(p for p, _ in ok), tuple(r for _, r in ok), failures)  # type: ignore[misc]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: ``taskset``, cpusets), not the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        return os.cpu_count() or 1


def jobs_for(jobs: int | None, files: int) -> int:
    """How many files are worked on at once: ``jobs`` (default: the usable cores), at most one per
    file, at least one."""
    if jobs is not None and jobs < 1:
        raise UsageError(f"jobs must be at least 1, not {jobs}")
    return max(1, min(jobs if jobs is not None else usable_cores(), files))


def each_file(
    func: Callable[[str], R],
    paths: Sequence[Path],
    jobs: int | None = None,
    pool: PoolKind | None = None,
    prepare: Callable[[], object] | None = None,
) -> Iterator[tuple[Path, R | None, str | None]]:
    """``(path, result, None)`` or ``(path, None, one-line reason)`` for every path, in input order
    and as soon as each is ready, ``func(str(path))`` running in ``jobs`` threads or processes
    (:func:`jobs_for`; one job: here, one file after another).

    Memory: at most ``jobs`` files are being worked on at once, and at most
    ``(1 + AHEAD_PER_JOB) * jobs`` results exist that the caller has not taken yet (a file is started
    only when the window has room), so a folder of any size costs ``jobs`` files' reads plus a few
    results. Closing the iterator early cancels the files not started and waits for those running.

    ``prepare`` runs here once before a process pool starts: what it imports, forked workers inherit
    instead of importing it each (where processes start by fork: Linux before Python 3.14)."""
    count = jobs_for(jobs, len(paths))
    names = [str(p) for p in paths]
    if count == 1:
        for path, name in zip(paths, names, strict=True):
            yield (path, *_Caught(func)._run(name))
        return
    kind = pool or LOCAL_POOL
    if kind == "processes" and prepare is not None:
        prepare()
    caught = _Caught(func, record=kind == "processes")
    executor = _executor(kind, count)
    try:
        window: deque[Future[Outcome[R]]] = deque()
        queued = iter(names)
        for name in queued:  # the first window's worth
            window.append(executor.submit(caught, name))
            if len(window) == (1 + AHEAD_PER_JOB) * count:
                break
        for index, path in enumerate(paths):
            outcome = _outcome(window.popleft())
            if outcome is None:  # the pool broke: this file and the rest, one at a time
                executor.shutdown(wait=False, cancel_futures=True)
                _warn_pool_died(count)
                yield from _one_at_a_time(caught, paths[index:])
                return
            following = next(queued, None)
            if following is not None:  # a slot freed: start the next file before handing this one over
                window.append(executor.submit(caught, following))
            _replay(outcome[2])
            yield path, outcome[0], outcome[1]
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _outcome(future: Future[Outcome[R]]) -> Outcome[R] | None:
    """A file's outcome, or None when its worker process died (killed: out of memory, most often),
    which breaks the whole pool."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool:
        return None


def _warn_pool_died(jobs: int) -> None:
    import warnings

    from layerscope.errors import LayerscopeWarning

    warnings.warn(
        f"a worker process died while {jobs} files were read at once (killed: out of memory?); "
        "reading the rest one at a time",
        LayerscopeWarning,
        stacklevel=4,
    )


def _one_at_a_time(caught: _Caught[R], paths: Sequence[Path]) -> Iterator[tuple[Path, R | None, str | None]]:
    """Each file in a worker process of its own pool, one after another: a file whose worker dies
    even alone is reported as failed and the next gets a fresh worker."""
    from concurrent.futures import ProcessPoolExecutor

    executor = ProcessPoolExecutor(max_workers=1)
    try:
        for path in paths:
            outcome = _outcome(executor.submit(caught, str(path)))
            if outcome is None:
                executor.shutdown(wait=False, cancel_futures=True)
                executor = ProcessPoolExecutor(max_workers=1)
                outcome = (None, "the worker process reading it died (killed: out of memory?)", ())
            _replay(outcome[2])
            yield path, outcome[0], outcome[1]
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def read_all(func: Callable[[Path], R], paths: Sequence[Path], jobs: int | None = None) -> list[R]:
    """``func(path)`` for every path, in threads (``jobs`` at a time, :func:`jobs_for`), every result
    kept and returned in input order; the first failure in input order is raised as it was. For work
    whose results are all needed together (the critical path through the ranks holds every rank's
    events): threads, since such results are too big to pickle back from a process."""
    from concurrent.futures import ThreadPoolExecutor

    count = jobs_for(jobs, len(paths))
    if count == 1:
        return [func(p) for p in paths]
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="layerscope-file") as executor:
        futures = [executor.submit(func, p) for p in paths]
        try:
            return [f.result() for f in futures]
        finally:
            for future in futures:  # after a failure: the files not started yet are not read
                future.cancel()


def _executor(pool: PoolKind, count: int) -> Executor:
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    if pool == "threads":
        return ThreadPoolExecutor(max_workers=count, thread_name_prefix="layerscope-file")
    if pool == "processes":
        return ProcessPoolExecutor(max_workers=count)
    raise UsageError(f"pool must be 'threads' or 'processes', not {pool!r}")


def describe(exc: BaseException) -> str:
    """One line for a failure: the message of our own errors, else the exception's type and message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, LayerscopeError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: A warning a worker process raised: message, category, file, line (replayed here in order).
Warned = tuple[str, type[Warning], str, int]
#: What :class:`_Caught` hands back: the result or the one-line reason, and the warnings recorded.
Outcome = tuple[R | None, str | None, tuple[Warned, ...]]
#: The replayed warnings' registry: the same warning from the same line shows once, as in one process.
_replayed: dict[Any, Any] = {}


class _Caught(Generic[R]):
    """Runs ``func`` (in a worker process or thread, or here) and hands back (result, None, ()) or
    (None, one-line reason, ()). ``record``: in a worker process, the warnings it raises are recorded
    and handed back with the outcome, to be shown here in the files' order (:func:`_replay`) rather
    than by each worker on its own (the warnings filter is per process, so not in threads)."""

    def __init__(self, func: Callable[[str], R], record: bool = False) -> None:
        self.func = func
        self.record = record

    def __call__(self, path: str) -> Outcome[R]:
        if not self.record:
            return (*self._run(path), ())
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # the parent's filters decide when they are replayed
            result, why = self._run(path)
        return result, why, tuple((str(w.message), w.category, w.filename, w.lineno) for w in caught)

    def _run(self, path: str) -> tuple[R | None, str | None]:
        try:
            return self.func(path), None
        except Exception as exc:
            return None, describe(exc)


def _replay(warned: tuple[Warned, ...]) -> None:
    """Show a worker's warnings here, through this process's filters and ``showwarning``."""
    import warnings

    for message, category, filename, lineno in warned:
        warnings.warn_explicit(message, category, filename, lineno, registry=_replayed)


def _client(scheduler: str | Client) -> tuple[Any, bool]:
    """A client of the cluster at ``scheduler`` (the one given, or a new one: then True)."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError(DASK_INSTALL_HINT) from None
    if isinstance(scheduler, Client):
        return scheduler, False
    try:
        return Client(str(scheduler), timeout=CONNECT_TIMEOUT_S, set_as_default=False), True  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError, ValueError) as exc:
        raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {describe(exc)}") from None


def all_files(
    func: Callable[[list[str]], R], paths: Sequence[Path], scheduler: str | Client | None = None
) -> R:
    """``func`` of every path at once (absolute paths), in this process or, with ``scheduler``, on
    one worker of that cluster (whose filesystem holds the files; only the result comes back)."""
    names = [str(Path(p).resolve()) for p in paths]
    if scheduler is None:
        return func(names)
    client, own_client = _client(scheduler)
    try:
        result: R = client.submit(func, names, pure=False).result()
        return result
    finally:
        if own_client:
            client.close()


def _on_dask(
    func: Callable[[str], R], paths: Sequence[Path], scheduler: str | Client, progress: ProgressLine
) -> list[tuple[R | None, str | None]]:
    from distributed import as_completed

    client, own_client = _client(scheduler)
    try:
        # Absolute paths: workers share the filesystem but not this process's working directory.
        futures = client.map(func, [str(Path(p).resolve()) for p in paths], retries=DASK_RETRIES, pure=False)
        index = {f.key: k for k, f in enumerate(futures)}
        outcomes: list[tuple[R | None, str | None]] = [(None, "not run")] * len(paths)
        failed = 0
        completed = as_completed(futures, loop=client.loop)  # type: ignore[no-untyped-call]
        for done, future in enumerate(completed, start=1):
            k = index[future.key]
            # Not `future.status`: a result can be lost with its worker right after it finished; the
            # scheduler then computes it again and result() waits for that, or raises the file's
            # own exception once its retries are spent.
            try:
                outcomes[k] = (future.result(), None)
            except Exception as exc:
                outcomes[k] = (None, describe(exc))
                failed += 1
            progress.update(done, failed)
            future.release()
        return outcomes
    finally:
        if own_client:
            client.close()
