"""FLOPs of one recorded op from its input shapes, with the formulas of ``torch.utils.flop_counter``.

The profiler records input shapes and scalar arguments ("concrete inputs") but not outputs, so the
few formulas that need an output shape (convolutions) get it computed here from stride, padding and
dilation. Formulas are torch's own (``flop_registry``), so layerscope agrees with FlopCounterMode.
CPU flash attention (``_scaled_dot_product_flash_attention_for_cpu``), which FlopCounterMode does not
know, uses torch's SDPA formula; that is the one deliberate difference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Shapes = Sequence[Sequence[int]]
Concrete = Sequence[Any]
_Formula = Callable[[Shapes, Concrete], int]


def _registry() -> dict[str, Callable[..., int]]:
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    wanted = {
        "mm": aten.mm,
        "bmm": aten.bmm,
        "convolution": aten.convolution,
        "conv_backward": aten.convolution_backward,
        "sdpa": aten._scaled_dot_product_flash_attention,
        "sdpa_backward": aten._scaled_dot_product_flash_attention_backward,
    }
    # Registered formulas are wrapped to accept tensors (a pytree walk per call, far costlier than
    # the formula); we pass shapes already, so call the wrapped formula directly with ``out_shape``.
    raw = {
        key: getattr(flop_registry[op], "__wrapped__", None)
        for key, op in wanted.items()
        if op in flop_registry
    }
    return {key: f for key, f in raw.items() if f is not None}


def _conv_out_shape(
    x: Sequence[int],
    w: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> list[int]:
    spatial = len(x) - 2

    def pick(values: Sequence[int], k: int) -> int:
        return int(values[k] if len(values) > k else values[0]) if values else 1

    out = [x[0], w[1] * groups if transposed else w[0]]
    for k in range(spatial):
        s, p, d = pick(stride, k), pick(padding, k) if padding else 0, pick(dilation, k)
        kernel = w[2 + k]
        if transposed:
            op = pick(output_padding, k) if output_padding else 0
            out.append((x[2 + k] - 1) * s - 2 * p + d * (kernel - 1) + op + 1)
        else:
            out.append((x[2 + k] + 2 * p - d * (kernel - 1) - 1) // s + 1)
    return out


class FlopCalculator:
    """Maps profiler op names (``aten::mm``) to FLOP counts; built once per capture."""

    def __init__(self) -> None:
        reg = _registry()
        #: op name -> how many distinct calls its formula refused (a shape error in the user's
        #: program records ops whose shapes no formula accepts); those calls count 0 FLOPs.
        self.failures: dict[str, int] = {}
        formulas: dict[str, _Formula] = {}
        if "mm" in reg:
            formulas["aten::mm"] = lambda s, c: reg["mm"](s[0], s[1], out_shape=None)
        if "mm" in reg:
            # torch's addmm formula is mm's over the two matrices, but calls the tensor-accepting
            # wrapper of mm (a pytree walk per call); calling mm's raw formula is the same count.
            formulas["aten::addmm"] = lambda s, c: reg["mm"](s[1], s[2], out_shape=None)
        if "bmm" in reg:
            formulas["aten::bmm"] = lambda s, c: reg["bmm"](s[0], s[1], out_shape=None)
        if "bmm" in reg:
            formulas["aten::baddbmm"] = lambda s, c: reg["bmm"](s[1], s[2], out_shape=None)  # as torch's
        if "convolution" in reg:
            formulas["aten::convolution"] = self._conv(reg["convolution"])
            formulas["aten::_convolution"] = self._conv(reg["convolution"])
        if "conv_backward" in reg:
            formulas["aten::convolution_backward"] = self._conv_backward(reg["conv_backward"])
        if "sdpa" in reg:
            sdpa = reg["sdpa"]

            def attention(s: Shapes, c: Concrete, f: Callable[..., int] = sdpa) -> int:
                return f(s[0], s[1], s[2], out_shape=None)

            for name in (
                "aten::_scaled_dot_product_flash_attention",
                "aten::_scaled_dot_product_efficient_attention",
                "aten::_scaled_dot_product_cudnn_attention",
                "aten::_scaled_dot_product_flash_attention_for_cpu",
            ):
                formulas[name] = attention
        if "sdpa_backward" in reg:
            back = reg["sdpa_backward"]

            def attention_backward(s: Shapes, c: Concrete, f: Callable[..., int] = back) -> int:
                return f(s[0], s[1], s[2], s[3], out_shape=None)

            for name in (
                "aten::_scaled_dot_product_flash_attention_backward",
                "aten::_scaled_dot_product_efficient_attention_backward",
                "aten::_scaled_dot_product_cudnn_attention_backward",
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
            ):
                formulas[name] = attention_backward
        self.formulas = formulas

    @staticmethod
    def _conv(formula: Callable[..., int]) -> _Formula:
        def count(shapes: Shapes, concrete: Concrete) -> int:
            x, w = shapes[0], shapes[1]
            stride, padding, dilation = concrete[3], concrete[4], concrete[5]
            transposed = bool(concrete[6])
            output_padding = concrete[7] if len(concrete) > 7 else []
            groups = int(concrete[8]) if len(concrete) > 8 and concrete[8] is not None else 1
            out = _conv_out_shape(x, w, stride, padding, dilation, transposed, output_padding, groups)
            return int(formula(x, w, None, stride, padding, dilation, transposed, out_shape=out))

        return count

    @staticmethod
    def _conv_backward(formula: Callable[..., int]) -> _Formula:
        def count(shapes: Shapes, concrete: Concrete) -> int:
            grad_out, x, w = shapes[0], shapes[1], shapes[2]
            transposed = bool(concrete[7])
            output_mask = concrete[10]
            return int(
                formula(
                    grad_out,
                    x,
                    w,
                    None,
                    concrete[4],
                    concrete[5],
                    concrete[6],
                    transposed,
                    concrete[8],
                    concrete[9],
                    output_mask,
                    out_shape=(list(x), list(w), None),
                )
            )

        return count

    def op_names(self) -> list[str]:
        """The op names that have a formula (whose shapes and concrete inputs are read)."""
        return list(self.formulas)

    def needs(self, name: str) -> bool:
        """True when ``name`` has a formula (only those ops need shapes and concrete inputs read)."""
        return name in self.formulas

    def count(self, name: str, shapes: Shapes, concrete: Concrete) -> int:
        """FLOPs of one call, or 0 when the recorded arguments do not fit the formula."""
        formula = self.formulas.get(name)
        if formula is None:
            return 0
        try:
            return max(0, int(formula(shapes, concrete)))
        except Exception:
            # Unusual overloads, missing concrete inputs, or the shapes of a call that failed (torch's
            # formulas assert on them): no number rather than a wrong one, and never a lost profile.
            self.failures[name] = self.failures.get(name, 0) + 1
            return 0
