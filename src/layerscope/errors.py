"""Errors layerscope raises on purpose; each carries the exit code the CLI returns for it."""

from __future__ import annotations


class LayerscopeError(Exception):
    """Base of every error layerscope raises deliberately (the CLI prints it on one line)."""

    exit_code: int = 1


class UsageError(LayerscopeError, ValueError):
    """A bad option or argument from the user (a wrong value, an unknown name)."""

    exit_code = 2


class TraceFormatError(LayerscopeError, ValueError):
    """A file that is not a readable profile or torch.profiler trace."""

    exit_code = 2


class CaptureError(LayerscopeError, RuntimeError):
    """Profiling could not start or finish (nested sessions, profiler failures)."""

    exit_code = 1


class ValidationError(LayerscopeError, AssertionError):
    """A Profile whose numbers do not add up (raised by ``Profile.validate``)."""

    exit_code = 1


class LayerscopeWarning(UserWarning):
    """Base of the warnings layerscope gives (the CLI prints them as one ``layerscope: warning:`` line)."""
