"""The native module: building it against the installed torch, finding it, loading it.

``native_reader.cpp`` reads torch's profiler results in C++ and takes module marks on torch's clock
(see its header). It cannot ship as a binary: ``KinetoEvent``'s layout and symbols belong to one
torch build. So it is compiled here, once per (torch build, Python, source) by ``layerscope native
build`` (``make demo``/``make test`` do it too), with the compiler torch's own extensions use, into a
cache folder. Profiling never compiles: without a built module, or when it fails to load, layerscope
reads through torch's Python bindings (the same table, slower to make) and scopes modules with
profiler ranges.

The same build makes a second, smaller module from ``native_trace.cpp``: the trace-file reader (and
attribution's kernels, ``native_nesting.cpp``, which live and trace-file profiles both use). It
does not link torch (only pybind11's headers, found beside torch or the ``pybind11`` package), so it is
keyed by its source, Python and platform alone, and reading a trace file loads it without importing
torch (``load_trace_reader``).

``LAYERSCOPE_NATIVE=0`` turns both off; ``LAYERSCOPE_CACHE`` moves the cache folder
(default ``~/.cache/layerscope``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from layerscope.errors import LayerscopeError

SOURCE = Path(__file__).with_name("native_reader.cpp")
#: Every source compiled into the module (the reader and marks; call lines; the flight recorder's
#: backward hooks; the live-tensor walk; input shapes recorded without torch's record_shapes).
SOURCES = (
    SOURCE,
    Path(__file__).with_name("native_lines.cpp"),
    Path(__file__).with_name("native_flight.cpp"),
    Path(__file__).with_name("native_objects.cpp"),
    Path(__file__).with_name("native_shapes.cpp"),
)
_MODULE_PREFIX = "_layerscope_native_"
#: The trace-file reader: its own module, built by the same ``build``, linked against nothing of torch.
TRACE_SOURCE = Path(__file__).with_name("native_trace.cpp")
#: Compiled into the trace-file reader's module: the reader and attribution's kernels (nesting,
#: grouping), which need no torch, so trace files and live captures both load them.
TRACE_SOURCES = (TRACE_SOURCE, Path(__file__).with_name("native_nesting.cpp"))
_TRACE_PREFIX = "_layerscope_trace_"

#: The loaded module, or the reason there is none; looked up once per process.
_loaded: ModuleType | None = None
_why_not: str | None = None
_looked = False
_lock = threading.Lock()  # two threads building profiles at once load the module once
_trace_reader: ModuleType | None = None
_trace_looked = False


@dataclass(frozen=True)
class NativeStatus:
    """Where the native module for this torch lives and whether it is in use."""

    path: Path
    built: bool
    enabled: bool
    #: Why it is not in use (not built, disabled, failed to load), or None when it is.
    reason: str | None


def cache_dir() -> Path:
    """The folder built readers go to (``LAYERSCOPE_CACHE`` or ``~/.cache/layerscope``)."""
    root = os.environ.get("LAYERSCOPE_CACHE")
    if root:
        return Path(root) / "native"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "layerscope" / "native"


def _build_key() -> str:
    """What the binary depends on: the source and how it is compiled, this torch build, this Python
    and platform."""
    import torch

    parts = [
        *(source.read_bytes() for source in SOURCES),
        Path(__file__).read_bytes(),  # the compile command lives here
        torch.__version__.encode(),
        str(getattr(torch.version, "git_version", "")).encode(),
        sys.version.encode(),
        platform.machine().encode(),
        str(sysconfig.get_config_var("EXT_SUFFIX")).encode(),
    ]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _module_name() -> str:
    return _MODULE_PREFIX + _build_key()


def _trace_module_name() -> str:
    """The trace reader's name: its source, how it is compiled, this Python and platform (no torch)."""
    digest = hashlib.sha256()
    for part in (
        *(source.read_bytes() for source in TRACE_SOURCES),
        Path(__file__).read_bytes(),
        sys.version.encode(),
        platform.machine().encode(),
        str(sysconfig.get_config_var("EXT_SUFFIX")).encode(),
    ):
        digest.update(part)
        digest.update(b"\0")
    return _TRACE_PREFIX + digest.hexdigest()[:16]


def trace_binary_path() -> Path:
    """Where the trace-file reader is (or would be) built."""
    return cache_dir() / (_trace_module_name() + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def _pybind11_include() -> Path:
    """pybind11's headers: the ``pybind11`` package's, else the copy torch ships (found without
    importing torch)."""
    try:
        import pybind11  # type: ignore[import-not-found,unused-ignore]

        return Path(pybind11.get_include())
    except ImportError:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            raise LayerscopeError("pybind11's headers not found (install pybind11 or torch)") from None
        return Path(next(iter(spec.submodule_search_locations))) / "include"


def compile_trace_command(output: Path) -> list[str]:
    """The compiler command that builds the trace-file reader into ``output``."""
    command = [_compiler(), "-O2", "-std=c++20", "-fPIC", "-shared", "-w"]
    command.append(f"-DLAYERSCOPE_TRACE_MODULE={_trace_module_name()}")
    for include in (_pybind11_include(), sysconfig.get_paths()["include"]):
        command += ["-isystem", str(include)]
    command += [*(str(source) for source in TRACE_SOURCES), "-o", str(output)]
    if sys.platform == "darwin":
        command += ["-undefined", "dynamic_lookup"]
    return command


def binary_path() -> Path:
    """Where the reader for the installed torch is (or would be) built."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / (_module_name() + suffix)


def turned_off(variable: str) -> bool:
    """Whether the environment variable says off (``0``, ``false``, ``no``, ``off``)."""
    return os.environ.get(variable, "1").strip().lower() in {"0", "false", "no", "off"}


def enabled() -> bool:
    """False when ``LAYERSCOPE_NATIVE=0`` turns the native module off."""
    return not turned_off("LAYERSCOPE_NATIVE")


def _compiler() -> str:
    found = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not found:
        raise LayerscopeError("no C++ compiler found (set CXX, or install g++ or clang++)")
    return found


def compile_command(output: Path) -> list[str]:
    """The compiler command that builds the reader into ``output`` (what torch's own
    ``cpp_extension`` passes, without needing ninja)."""
    import torch

    # The paths torch.utils.cpp_extension would use, without importing it (on a CUDA build without a
    # GPU its import prints a warning about the CUDA runtime, which this build does not need).
    torch_dir = Path(torch.__file__).resolve().parent
    includes = [torch_dir / "include", torch_dir / "include" / "torch" / "csrc" / "api" / "include"]
    if (torch_dir / "include" / "kineto").is_dir():  # torch's profiler headers include its headers by name
        includes.append(torch_dir / "include" / "kineto")
    # -pthread: the reader's pass runs on threads of its own (std::thread)
    command = [_compiler(), "-O2", "-std=c++20", "-fPIC", "-shared", "-w", "-pthread"]
    command.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    command += [f"-DTORCH_EXTENSION_NAME={_module_name()}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for include in [*includes, sysconfig.get_paths()["include"]]:
        command += ["-isystem", str(include)]
    command += [*(str(source) for source in SOURCES), "-o", str(output), f"-L{torch_dir / 'lib'}"]
    command += ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    if sys.platform == "darwin":
        command += ["-undefined", "dynamic_lookup"]
    return command


def _first_error(output: str) -> str:
    """The compiler's first error line, as ``: <line>`` (or nothing when it printed none)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    picked = errors[0] if errors else (lines[-1] if lines else "")
    return f": {picked[:300]}" if picked else ""


def build(force: bool = False) -> tuple[Path, float]:
    """Compile the native module for the installed torch and the trace-file reader (each skipped
    when already built, unless ``force``).

    Returns the native module's path and the seconds spent compiling (0 when both were there). A
    binary appears whole or not at all (compiled under a temporary name, then renamed).
    """
    if sys.platform == "win32":
        raise LayerscopeError("the native module is not supported on Windows; the Python reader is used")
    target = binary_path()
    seconds = _compile(target, compile_command) if force or not target.exists() else 0.0
    seconds += build_trace_reader(force)[1]
    if seconds:
        forget()  # the next load() looks again
    return target, seconds


def build_trace_reader(force: bool = False) -> tuple[Path, float]:
    """Compile the trace-file reader alone (``build`` does it too); its path and the seconds taken."""
    target = trace_binary_path()
    seconds = _compile(target, compile_trace_command) if force or not target.exists() else 0.0
    if seconds:
        forget()
    return target, seconds


def _compile(target: Path, command_for: Callable[[Path], list[str]]) -> float:
    """Run one compile into ``target``; the seconds it took."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # The compiler creates the binary in a private folder, with the mode its umask gives (an mkstemp
    # file would stay 0600 plus execute bits: unreadable to the other users of a shared cache).
    workdir = tempfile.mkdtemp(dir=target.parent, prefix=".building-")
    scratch = os.path.join(workdir, target.name)
    started = time.perf_counter()
    try:
        command = command_for(Path(scratch))
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LayerscopeError(
                f"compiling the native module failed ({Path(command[0]).name} exited {done.returncode})"
                + _first_error(done.stderr or done.stdout)
            )
        os.replace(scratch, target)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return time.perf_counter() - started


def load() -> ModuleType | None:
    """The native module when it is built, enabled and loads; else None (see :func:`status`)."""
    global _loaded, _why_not, _looked
    if not enabled():
        return None
    if _looked:
        return _loaded
    with _lock:
        if not _looked:
            _loaded, _why_not = _load_binary(binary_path())
            _looked = True
    return _loaded


def _load_binary(path: Path) -> tuple[ModuleType | None, str | None]:
    """The module at ``path``, or None and why not."""
    if not path.exists():
        return None, "not built (run `layerscope native build`)"
    name = path.name.split(".")[0]
    try:
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        if spec is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception as exc:  # a broken binary must never stop a profile
        return None, f"failed to load: {exc}"
    return module, None


def load_trace_reader() -> ModuleType | None:
    """The trace-file reader when it is built, enabled and loads; else None (the Python reader is
    used). Never imports torch."""
    global _trace_reader, _trace_looked
    if not enabled():
        return None
    if not _trace_looked:
        with _lock:
            if not _trace_looked:
                _trace_reader = _load_binary(trace_binary_path())[0]
                _trace_looked = True
    return _trace_reader


def forget() -> None:
    """Look for the reader again at the next :func:`load` (after ``LAYERSCOPE_*`` changed)."""
    global _loaded, _why_not, _looked, _trace_reader, _trace_looked
    _loaded, _why_not, _looked = None, None, False
    _trace_reader, _trace_looked = None, False


def disable_for_process(reason: str) -> None:
    """Stop using the native module in this process (after it raised), remembering why."""
    global _loaded, _why_not, _looked
    _loaded, _why_not, _looked = None, reason, True


def status() -> NativeStatus:
    """Whether the native module is built for this torch, enabled, and loads."""
    path = binary_path()
    if not enabled():
        return NativeStatus(path, path.exists(), False, "turned off by LAYERSCOPE_NATIVE=0")
    module = load()
    return NativeStatus(path, path.exists(), True, None if module is not None else _why_not)
