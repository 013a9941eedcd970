"""Event-name conventions: what a profiler event's name says about it, owned in one place.

Torch names some ranges by convention (``ProfilerStep#N``, ``autograd::engine::evaluate_function:
X``, ``## Call CompiledFxGraph ... ##``, ``nn.Module: X``, ``[memory]``); layerscope names its own
module ranges (``ls:<path>:<Type>``); users mark training steps with ``record_function("step N")``.
Capture (which opens and reads ranges), the trace readers (which recognise them), attribution (which
gives each name a role) and analysis (which reads steps and torch's loop ranges) all ask this module:
no other file spells a prefix. It imports nothing of layerscope, so every layer above ``model`` can
use it.
"""

from __future__ import annotations

import re

# ---- steps ------------------------------------------------------------------------------------------

#: The range torch opens for each training step under a schedule (``prof.step()``): ``ProfilerStep#12``.
PROFILER_STEP_PREFIX = "ProfilerStep#"

#: A user step annotation: a ``record_function`` range named ``step N``, ``step#N``, ``step_N`` or ``stepN``
#: (``step`` in any case, N a non-negative integer, nothing before or after). Where a trace has any,
#: they give the step windows, not ``ProfilerStep#N`` (see :mod:`layerscope.events.steps`).
USER_STEP_PATTERN = re.compile(r"step[ #_]?([0-9]+)", re.IGNORECASE)

#: The number of a step whose name carries none a reader can parse (``ProfilerStep#x``).
UNKNOWN_STEP = -1


def profiler_step_number(name: str) -> int | None:
    """``"ProfilerStep#12"`` -> 12; ``UNKNOWN_STEP`` when the suffix is not a number; None when
    ``name`` is not torch's step range."""
    if not name.startswith(PROFILER_STEP_PREFIX):
        return None
    suffix = name[len(PROFILER_STEP_PREFIX) :]
    return int(suffix) if suffix.isascii() and suffix.isdigit() else UNKNOWN_STEP


def user_step_number(name: str) -> int | None:
    """``"step 3"`` / ``"Step#3"`` / ``"step_3"`` -> 3; None for any other name."""
    found = USER_STEP_PATTERN.fullmatch(name)
    return int(found.group(1)) if found else None


def is_step_range(name: str) -> int | None:
    """The step number a range name marks (torch's ``ProfilerStep#N`` or a user step annotation),
    None when it marks no step. Which of the two kinds gives a trace's step windows is decided per
    trace (:func:`layerscope.events.steps.step_windows`): this says only what a name marks."""
    found = profiler_step_number(name)
    return found if found is not None else user_step_number(name)


# ---- layerscope's module ranges ---------------------------------------------------------------------

#: Prefix of the record_function ranges layerscope opens around every module call.
MODULE_RANGE_PREFIX = "ls:"


def module_range_name(path: str, type_name: str) -> str:
    """The range name for a module call: ``ls:<path>:<Type>`` (type names never contain ':')."""
    return f"{MODULE_RANGE_PREFIX}{path}:{type_name}"


def parse_module_range(name: str) -> tuple[str, str] | None:
    """``(path, type_name)`` of a layerscope module range name, or None for any other name."""
    if not name.startswith(MODULE_RANGE_PREFIX):
        return None
    body, sep, type_name = name[len(MODULE_RANGE_PREFIX) :].rpartition(":")
    if not sep or not type_name:
        return None
    return body, type_name


#: Torch's ``with_stack`` Python event of a module call: ``nn.Module: Linear_0``.
NN_MODULE_EVENT_PREFIX = "nn.Module: "
#: Python frames of ``nn.Module`` itself in a recorded stack (``nn.Module.__call__``...).
NN_MODULE_FRAME_PREFIX = "nn.Module."


def nn_module_event_label(name: str) -> str | None:
    """``"nn.Module: Linear_0"`` -> ``"Linear_0"``; None for any other name."""
    if not name.startswith(NN_MODULE_EVENT_PREFIX):
        return None
    return name[len(NN_MODULE_EVENT_PREFIX) :].strip()


# ---- autograd ---------------------------------------------------------------------------------------

#: The range autograd's engine opens around each backward node it runs.
BACKWARD_NODE_PREFIX = "autograd::engine::evaluate_function: "
#: The backward node of reentrant activation checkpointing (``use_reentrant=True``).
REENTRANT_CHECKPOINT_NODE = f"{BACKWARD_NODE_PREFIX}CheckpointFunctionBackward"


def backward_node_name(name: str) -> str | None:
    """``"autograd::engine::evaluate_function: MmBackward0"`` -> ``"MmBackward0"``; None otherwise."""
    return name[len(BACKWARD_NODE_PREFIX) :] if name.startswith(BACKWARD_NODE_PREFIX) else None


# ---- torch.compile ----------------------------------------------------------------------------------

#: The range around each call of a compiled graph (``## Call CompiledFxGraph <key> ##``).
COMPILED_GRAPH_PREFIX = "## Call CompiledFxGraph"
#: Ranges in which torch.compile compiles: Dynamo's frame (forward), AOTAutograd's lazy backward, and
#: Inductor's C++ builds on worker threads; phases timed by ``dynamo_timed`` end in this suffix.
COMPILING_NAMES = frozenset({"dynamo", "entire_backward_compile", "compile_file"})
COMPILING_SUFFIX = "(dynamo_timed)"


def is_compiling_range(name: str) -> bool:
    """Whether a range name is torch.compile at work (compiling, not running compiled code)."""
    return name in COMPILING_NAMES or name.endswith(COMPILING_SUFFIX)


def is_compiled_graph_call(name: str) -> bool:
    """Whether a range name is a call of a compiled graph (its kernels are its children)."""
    return name.startswith(COMPILED_GRAPH_PREFIX)


# ---- device work and memory -------------------------------------------------------------------------

#: Device activities named by what they do: copies (``Memcpy HtoD``...) and sets (``Memset (Device)``).
MEMCPY_PREFIX = "Memcpy"
MEMSET_PREFIX = "Memset"
#: Torch's instant events of an allocation or free, and of an allocation the allocator refused.
MEMORY_EVENT = "[memory]"
OUT_OF_MEMORY_EVENT = "[OutOfMemory]"
MEMORY_EVENTS = frozenset({MEMORY_EVENT, OUT_OF_MEMORY_EVENT})

# ---- torch's ranges around the training loop --------------------------------------------------------

#: Range name prefixes torch opens around the loop's own work, with a readable name for each.
DATA_LOADER_PREFIX = "enumerate(DataLoader)"
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
OPTIMIZER_ZERO_GRAD_PREFIX = "Optimizer.zero_grad#"
