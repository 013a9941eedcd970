"""A flight-recorder step's module calls: forward marks paired into calls, backward spans placed.

Forward: each thread's marks nest, so an enter and the next matching exit are one call, and the call
open when another enters is its parent (a mark without its other half, a call still running when the
dump was taken, gives no call, as a profiler range would give no event).

Backward: autograd runs a module's backward from C++, with no module call to hook. The recorder hooks
the node that made each call's output: that node runs first in the call's backward, so its start is
the call's backward start. The call's backward ends when the engine moves on to work made before the
call began: the first later start of a call whose forward ended before this one's began, else the
end of the pass. Work between (the call's other nodes, its parameters' gradient accumulation) is the
call's. A parent's span is widened to hold its children's (the hull), and where siblings' spans
overlap (the engine interleaving branches) the parent's self time is clipped at zero and its total
raised to its children's sum, so that self + children = total holds (``Profile.validate``).

Recomputation: a call that starts inside a backward pass (activation checkpointing re-running a
module) is backward work, as in a profile (``recompute_calls``): its forward and its own backward
together are its backward span, and a recomputed call with no forward parent is placed under the
innermost call whose backward span holds its start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.events.flight_records import PASS_END, FlightStep


@dataclass(frozen=True)
class StepCalls:
    """The calls of one step, in the order they began (children after their parent)."""

    module: list[int]  # index into the recorder's module list (0-based)
    parent: list[int]  # the enclosing call, -1 for a top-level call
    forward_ns: list[int]  # inclusive forward time
    forward_self_ns: list[int]
    backward_ns: list[int]  # inclusive backward time (0: no backward seen)
    backward_self_ns: list[int]
    recompute: list[bool]  # started inside a backward pass: all its time is backward


def step_calls(step: FlightStep) -> StepCalls:
    """Pair ``step``'s marks into calls and place their backward (see the module docstring)."""
    module, parent, enter_row, exit_row, start, end = _pair_forward(step)
    n = len(module)
    passes = _backward_passes(step, enter_row, exit_row)
    recompute = [any(p.holds(start[c]) for p in passes) for c in range(n)]
    forward_ns = [0 if recompute[c] else end[c] - start[c] for c in range(n)]
    forward_self = _self_times(forward_ns, parent)
    backward_ns = [0] * n
    for found in passes:  # each pass on its own: a graph run twice adds, not the time between
        for c in range(n):
            if recompute[c] and found.holds(start[c]):  # the re-run forward is in its backward span
                found.widen(c, start[c], end[c])
                if parent[c] < 0:
                    parent[c] = found.innermost_holding(start[c], recompute)
        # Hull: a parent's backward holds its children's (children began after their parent).
        for c in range(n - 1, -1, -1):
            p = parent[c]
            if p >= 0 and c in found.begin:
                found.widen(p, found.begin[c], found.finish[c])
        for c, b in found.begin.items():
            backward_ns[c] += found.finish[c] - b
    backward_ns, backward_self = _totals_holding_children(backward_ns, parent)
    return StepCalls(module, parent, forward_ns, forward_self, backward_ns, backward_self, recompute)


def _pair_forward(
    step: FlightStep,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """Per call (ids in start order): module, parent call, enter and exit rows, start and end ns;
    calls without both marks are left out."""
    rows = step.forward.tolist()
    ids_by_enter: dict[int, int] = {}  # enter row -> provisional id
    open_by_thread: dict[int, list[tuple[int, int]]] = {}  # thread -> [(code, enter row)]
    closed: dict[int, tuple[int, int]] = {}  # enter row -> (exit row, parent's enter row or -1)
    parent_row: dict[int, int] = {}
    for row, (_, code, thread) in enumerate(rows):
        stack = open_by_thread.setdefault(thread, [])
        if code > 0:
            parent_row[row] = stack[-1][1] if stack else -1
            stack.append((code, row))
            continue
        if not any(opened == -code for opened, _ in stack):
            continue  # its enter came before the record began
        while stack[-1][0] != -code:  # a child's lost exit: drop the child
            stack.pop()
        _, enter = stack.pop()
        closed[enter] = (row, parent_row[enter])
    module: list[int] = []
    parent: list[int] = []
    enter_row: list[int] = []
    exit_row: list[int] = []
    start: list[int] = []
    end: list[int] = []
    for enter in sorted(closed):
        exit_at, parent_enter = closed[enter]
        ids_by_enter[enter] = len(module)
        module.append(rows[enter][1] - 1)
        while parent_enter >= 0 and parent_enter not in ids_by_enter:  # an ancestor that made no call
            parent_enter = parent_row[parent_enter]
        parent.append(ids_by_enter.get(parent_enter, -1))
        enter_row.append(enter)
        exit_row.append(exit_at)
        start.append(rows[enter][0])
        end.append(rows[exit_at][0])
    return module, parent, enter_row, exit_row, start, end


@dataclass
class _Pass:
    """One backward pass: its window (first event to end) and each call's span in it."""

    first: int
    end: int
    begin: dict[int, int]
    finish: dict[int, int]

    def holds(self, at: int) -> bool:
        return self.first <= at <= self.end

    def widen(self, call: int, begin: int, finish: int) -> None:
        self.begin[call] = min(self.begin.get(call, begin), begin)
        self.finish[call] = max(self.finish.get(call, finish), finish)

    def innermost_holding(self, at: int, recompute: list[bool]) -> int:
        """The call (not itself recomputed) with the shortest span holding ``at``; -1: none."""
        best, best_length = -1, None
        for c, b in self.begin.items():
            length = self.finish[c] - b
            if (
                not recompute[c]
                and b <= at <= self.finish[c]
                and (best_length is None or length < best_length)
            ):
                best, best_length = c, length
        return best


def _backward_passes(step: FlightStep, enter_row: list[int], exit_row: list[int]) -> list[_Pass]:
    """Each backward pass with each call's own span in it (before the hull); a pass still running
    ends with the step."""
    call_of_exit = {row: c for c, row in enumerate(exit_row)}
    events = step.backward.tolist()
    passes: list[_Pass] = []
    k = 0
    while k < len(events):
        pass_end = k
        while pass_end < len(events) and events[pass_end][1] != PASS_END:
            pass_end += 1
        end_ns = events[pass_end][0] if pass_end < len(events) else step.end_ns
        found = _Pass(events[k][0], end_ns, {}, {})
        starts = [(t, call_of_exit[row]) for t, row in events[k:pass_end] if row in call_of_exit]
        for i, (t, c) in enumerate(starts):
            if c in found.begin:
                continue  # a second output node of the same call, inside its span
            done = end_ns
            for j in range(i + 1, len(starts)):
                later_t, later = starts[j]
                if exit_row[later] < enter_row[c]:  # work made before this call began
                    done = later_t
                    break
            found.widen(c, t, done)
        if pass_end > k:
            passes.append(found)
        k = pass_end + 1
    return passes


def _self_times(total: list[int], parent: list[int]) -> list[int]:
    """Self = total - direct children's totals (forward calls nest exactly)."""
    own = list(total)
    for c, p in enumerate(parent):
        if p >= 0:
            own[p] -= total[c]
    return [max(0, v) for v in own]


def _totals_holding_children(total: list[int], parent: list[int]) -> tuple[list[int], list[int]]:
    """Totals raised to at least the children's sum, and the self times they leave (see the module
    docstring)."""
    n = len(total)
    children_sum = [0] * n
    totals = list(total)
    for c in range(n - 1, -1, -1):  # children (higher ids) before their parents
        totals[c] = max(totals[c], children_sum[c])
        if parent[c] >= 0:
            children_sum[parent[c]] += totals[c]
    return totals, [totals[c] - children_sum[c] for c in range(n)]


def module_sums(calls: StepCalls, n_modules: int) -> tuple[np.ndarray, np.ndarray]:
    """Per module, inclusive (forward, backward) ns summed over its calls: shape (n_modules, 2).
    Also the calls per module (recomputations included). A module nested in itself counts its outer
    call only."""
    inclusive = np.zeros((n_modules, 2), dtype=np.int64)
    counts = np.zeros(n_modules, dtype=np.int64)
    for c, m in enumerate(calls.module):
        counts[m] += 1
        if _inside_same_module(calls, c):
            continue
        inclusive[m, 0] += calls.forward_ns[c]
        inclusive[m, 1] += calls.backward_ns[c]
    return inclusive, counts


def _inside_same_module(calls: StepCalls, c: int) -> bool:
    p = calls.parent[c]
    while p >= 0:
        if calls.module[p] == calls.module[c]:
            return True
        p = calls.parent[p]
    return False
