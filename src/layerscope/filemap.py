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
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from layerscope.errors import LayerscopeError, UsageError

if TYPE_CHECKING:
    from distributed import Client

R = TypeVar("R")

#: How often Dask re-runs a file whose work raised before the file counts as failed. A worker that
#: dies mid-file is handled by Dask itself: the file is re-run elsewhere (up to the scheduler's
#: ``allowed-failures``), then counted as failed with ``KilledWorker``.
DASK_RETRIES = 2
#: Seconds to wait for the scheduler before giving up (Dask keeps retrying a refused connection).
CONNECT_TIMEOUT_S = 10.0
DASK_INSTALL_HINT = "--scheduler needs Dask distributed: pip install 'layerscope[dask]'"


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
    workers: int | None = None,
    what: str = "read",
) -> FileResults[R]:
    """``func(str(path))`` for every path: on the Dask cluster at ``scheduler`` (an address such as
    ``tcp://host:8786``, or a ``distributed.Client``), else in local processes (``workers`` of
    them; one file or one core runs in this process). ``func`` must be importable by the workers."""
    progress = ProgressLine(what, len(paths))
    if scheduler is not None:
        outcomes = _on_dask(func, paths, scheduler, progress)
    else:
        outcomes = _local(func, paths, workers, progress)
    ok = [(p, r) for p, (r, err) in zip(paths, outcomes, strict=True) if err is None]
    failures = tuple((p, err) for p, (_, err) in zip(paths, outcomes, strict=True) if err is not None)
    progress.update(len(paths), len(failures), final=True)
    return FileResults(tuple(p for p, _ in ok), tuple(r for _, r in ok), failures)  # type: ignore[misc]


def describe(exc: BaseException) -> str:
    """One line for a failure: the message of our own errors, else the exception's type and message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, LayerscopeError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Caught(Generic[R]):
    """Runs ``func`` in a worker process and hands back (result, None) or (None, reason)."""

    def __init__(self, func: Callable[[str], R]) -> None:
        self.func = func

    def __call__(self, path: str) -> tuple[R | None, str | None]:
        try:
            return self.func(path), None
        except Exception as exc:
            return None, describe(exc)


def _local(
    func: Callable[[str], R], paths: Sequence[Path], workers: int | None, progress: ProgressLine
) -> list[tuple[R | None, str | None]]:
    from concurrent.futures import ProcessPoolExecutor

    caught = _Caught(func)
    names = [str(p) for p in paths]
    count = workers if workers is not None else min(len(paths), os.cpu_count() or 1)
    parallel = count > 1 and len(paths) > 1  # one file or one core: in this process
    outcomes: list[tuple[R | None, str | None]] = []
    failed = 0
    with ProcessPoolExecutor(max_workers=count) if parallel else nullcontext() as pool:
        chunk = max(1, len(paths) // (4 * count))
        for outcome in pool.map(caught, names, chunksize=chunk) if pool else map(caught, names):
            outcomes.append(outcome)
            failed += outcome[1] is not None
            progress.update(len(outcomes), failed)
    return outcomes


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
