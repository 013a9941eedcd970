"""The native module: building it against the installed torch, finding it, loading it.

``native_reader.cpp`` reads torch's profiler results in C++ and takes module marks on torch's clock
(see its header). It cannot ship as a binary: ``KinetoEvent``'s layout and symbols belong to one
torch build. So it is compiled here, once per (torch build, Python, source) by ``layerscope native
build`` (``make demo``/``make test`` do it too), with the compiler torch's own extensions use, into a
cache folder. Profiling never compiles: without a built module, or when it fails to load, layerscope
reads through torch's Python bindings (the same table, slower to make) and scopes modules with
profiler ranges.

``LAYERSCOPE_NATIVE=0`` turns the native module off; ``LAYERSCOPE_CACHE`` moves the cache folder
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
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from layerscope.errors import LayerscopeError

SOURCE = Path(__file__).with_name("native_reader.cpp")
#: Every source compiled into the module (the reader and marks; call lines; the flight recorder's
#: backward hooks).
SOURCES = (
    SOURCE,
    Path(__file__).with_name("native_lines.cpp"),
    Path(__file__).with_name("native_flight.cpp"),
    Path(__file__).with_name("native_objects.cpp"),
)
_MODULE_PREFIX = "_layerscope_native_"

#: The loaded module, or the reason there is none; looked up once per process.
_loaded: ModuleType | None = None
_why_not: str | None = None
_looked = False
_lock = threading.Lock()  # two threads building profiles at once load the module once


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
    command = [_compiler(), "-O2", "-std=c++20", "-fPIC", "-shared", "-w"]
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
    """Compile the reader for the installed torch (skipped when already built, unless ``force``).

    Returns the binary's path and the seconds spent compiling (0 when it was there). The binary
    appears whole or not at all (compiled under a temporary name, then renamed).
    """
    if sys.platform == "win32":
        raise LayerscopeError("the native module is not supported on Windows; the Python reader is used")
    target = binary_path()
    if target.exists() and not force:
        return target, 0.0
    target.parent.mkdir(parents=True, exist_ok=True)
    # The compiler creates the binary in a private folder, with the mode its umask gives (an mkstemp
    # file would stay 0600 plus execute bits: unreadable to the other users of a shared cache).
    workdir = tempfile.mkdtemp(dir=target.parent, prefix=".building-")
    scratch = os.path.join(workdir, target.name)
    started = time.perf_counter()
    try:
        command = compile_command(Path(scratch))
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LayerscopeError(
                f"compiling the native module failed ({Path(command[0]).name} exited {done.returncode})"
                + _first_error(done.stderr or done.stdout)
            )
        os.replace(scratch, target)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    forget()  # the next load() looks again
    return target, time.perf_counter() - started


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


def forget() -> None:
    """Look for the reader again at the next :func:`load` (after ``LAYERSCOPE_*`` changed)."""
    global _loaded, _why_not, _looked
    _loaded, _why_not, _looked = None, None, False


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
