"""Bytes one op moves, from the input shapes and dtypes the profiler recorded: the one owner of
this rule (the roofline reads it through op rows; estimates may call :func:`op_bytes` directly).

**Rule.** Bytes = every tensor input read once + every output written once, at the element size
of its dtype. torch.profiler records inputs only, so outputs are derived from them for the ops
below (matrix products, convolutions, elementwise and activation ops with broadcasting, norms,
softmax, embedding, copies, attention, dropout, reductions); other ops are unknown (None).
View and allocation ops (``view``, ``t``, ``expand``, ``empty``...) move nothing (0);
ops that only hand work to other ops (``linear``, ``matmul``, ``to``, ``reshape``, autograd nodes)
are wrappers (:data:`WRAPPER`): their bytes are their children's.

**A lower bound**, wrong in known ways: caches are ignored (a weight re-read by every tile of a
matmul counts once, an input a second op re-reads from cache counts twice, once per op); in-place
ops count ``self`` read and written; reductions count a one-element output when the dims reduced are
not recorded (concrete arguments), gradients of convolutions, norms and embeddings count only the
gradient of the input (the others depend on masks not recorded); fused or compiled kernels
(Inductor's Triton kernels, custom ops) record no shapes: unknown, since what we capture holds no
Inductor estimate (it writes ``kernel_num_gb`` only under ``benchmark_kernel``/``profile_bandwidth``).
A transposed convolution's output is taken from its FLOPs as a forward convolution's would be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: Bytes per element of torch's dtype spellings (``Input type`` in traces).
ELEMENT_BYTES: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}


def _names(text: str) -> frozenset[str]:
    """Op names (without ``aten::``), written as words."""
    return frozenset(text.split())


#: An op that only calls other ops: its bytes are its children's (``attribution/span_bytes.py``).
WRAPPER = -2

_ZERO = _names(
    "view _unsafe_view _reshape_alias t transpose permute expand expand_as as_strided unsqueeze "
    "squeeze select slice narrow detach alias resolve_conj resolve_neg empty empty_like "
    "empty_strided split split_with_sizes chunk unbind lift_fresh numpy_T unflatten flatten "
    "view_as real imag set_",
)
_WRAPPERS = _names(
    "linear matmul to _to_copy type_as reshape contiguous conv1d conv2d conv3d conv_transpose1d "
    "conv_transpose2d conv_transpose3d dropout feature_dropout batch_norm instance_norm "
    "_batch_norm_impl_index group_norm einsum tensordot cross_entropy_loss nll_loss_nd "
    "AccumulateGrad torch::autograd::AccumulateGrad",
)
_ELEMENTWISE = _names(
    "add sub rsub mul div true_divide floor_divide remainder pow neg abs sign exp exp2 expm1 log "
    "log2 log10 log1p sqrt rsqrt reciprocal sin cos tan tanh sinh cosh sigmoid relu relu6 gelu "
    "silu mish elu selu celu leaky_relu hardtanh hardsigmoid hardswish softplus erf erfc "
    "clamp clamp_min clamp_max clip maximum minimum lerp addcmul addcdiv masked_fill "
    "threshold threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward "
    "elu_backward leaky_relu_backward hardtanh_backward hardswish_backward softplus_backward "
    "mish_backward where square floor ceil round trunc frac nan_to_num bitwise_and bitwise_or "
    "bitwise_not bitwise_xor logical_not logical_and logical_or eq ne lt le gt ge isnan isinf "
    "clone",
)
_BOOL_OUT = _names("eq ne lt le gt ge isnan isinf logical_not logical_and logical_or")
_WRITE_ONLY = _names("fill zero normal uniform random bernoulli exponential")
_REDUCTIONS = _names(
    "sum mean amax amin max min prod norm linalg_vector_norm var std var_mean std_mean argmax "
    "argmin any all logsumexp",
)
_SAME_AS_FIRST = _names(
    "_softmax softmax _log_softmax log_softmax _safe_softmax native_layer_norm layer_norm "
    "native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training "
    "cudnn_batch_norm miopen_batch_norm native_group_norm rms_norm _fused_rms_norm "
    "_softmax_backward_data _log_softmax_backward_data native_layer_norm_backward "
    "native_batch_norm_backward cudnn_batch_norm_backward native_group_norm_backward "
    "_fused_rms_norm_backward",
)
_ATTENTION = _names(
    "scaled_dot_product_attention _scaled_dot_product_flash_attention "
    "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
    "_scaled_dot_product_flash_attention_for_cpu",
)

Shape = Sequence[int]


def op_bytes(name: str, shapes: Sequence[Any], dtypes: Sequence[str], flops: int = 0) -> int:
    """Bytes one call of ``name`` reads and writes (inputs + outputs), :data:`WRAPPER` for ops whose
    bytes are their children's, or -1 when they cannot be derived. ``shapes`` and ``dtypes`` are the
    recorded inputs (``Input Dims``, ``Input type``); ``flops`` the call's FLOPs when counted
    (convolutions take their output size from them)."""
    base = name.removeprefix("aten::")
    if base.endswith("_") and not base.startswith("_") and base not in _ZERO:
        base = base[:-1]  # in-place: self is read and written, the out-of-place rule's count
    if base in _ZERO:
        return 0
    if base in _WRAPPERS or base.endswith(("Backward0", "Backward1")):
        return WRAPPER
    tensors = _tensors(shapes, dtypes)
    if not tensors:
        return -1
    found = _derived(base, tensors, flops)
    return -1 if found is None else found


def _derived(base: str, tensors: list[tuple[Shape, int, str]], flops: int) -> int | None:
    """Bytes for the op families this module knows; None for the rest."""
    read = sum(_numel(s) * size for s, size, _ in tensors)
    first_shape, first_size, _ = tensors[0]
    if base in _ELEMENTWISE:
        out = _broadcast([s for s, _, _ in tensors])
        if out is None:
            return None
        size = tensors[1][1] if base == "where" and len(tensors) > 1 else first_size
        size = 1 if base in _BOOL_OUT else size
        return read + _numel(out) * size
    if base in _WRITE_ONLY:
        return _numel(first_shape) * first_size
    if base == "copy":  # copy_(dst, src): src read, dst written
        return read if len(tensors) >= 2 else None
    if base in _REDUCTIONS:
        return read + first_size  # the dims reduced are not recorded: a one-element output
    if base in _SAME_AS_FIRST or base in _ATTENTION:
        return read + _numel(first_shape) * first_size
    if base in ("native_dropout", "dropout"):
        return read + _numel(first_shape) * (first_size + 1)  # output and a bool mask
    if base == "embedding":  # (weight [V, D], indices): the rows gathered, not the whole table
        if len(tensors) < 2 or len(first_shape) != 2:
            return None
        rows = _numel(tensors[1][0])
        return tensors[1][1] * rows + 2 * rows * first_shape[1] * first_size
    if base in ("embedding_backward", "embedding_dense_backward", "convolution_backward"):
        return read  # the outputs' sizes are arguments not recorded
    return _products(base, tensors, read, flops)


def _products(base: str, tensors: list[tuple[Shape, int, str]], read: int, flops: int) -> int | None:
    """Matrix products and convolutions: their output from the operands (or the FLOPs)."""
    mats = [s for s, _, _ in tensors]
    size = tensors[0][1]
    if base in ("mm", "addmm", "bmm", "baddbmm"):
        a, b = (mats[0], mats[1]) if base in ("mm", "bmm") else (mats[-2], mats[-1])
        if len(a) < 2 or len(b) < 2:
            return None
        return read + _numel([*a[:-1], b[-1]]) * size
    if base in ("convolution", "_convolution", "mkldnn_convolution", "cudnn_convolution"):
        if len(mats) < 2 or len(mats[1]) < 3 or flops <= 0:
            return None
        per_output = 2 * _numel(mats[1][1:])  # FLOPs per output element: 2 x C_in/groups x kernel
        return read + (flops // per_output) * size
    return None


def _tensors(shapes: Sequence[Any], dtypes: Sequence[str]) -> list[tuple[Shape, int, str]]:
    """The tensor inputs (a dtype with an element size, a flat shape): (shape, element bytes, dtype)."""
    found: list[tuple[Shape, int, str]] = []
    for shape, dtype in zip(shapes, dtypes, strict=False):
        size = ELEMENT_BYTES.get(dtype)
        if size is not None and isinstance(shape, list) and all(isinstance(d, int) for d in shape):
            found.append((shape, size, dtype))
    return found


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _broadcast(shapes: list[Shape]) -> list[int] | None:
    """The broadcast of shapes (numpy's rules), None when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        for k, d in enumerate(shape, start=rank - len(shape)):
            if d != out[k] and out[k] != 1 and d != 1:
                return None
            out[k] = d if out[k] == 1 else out[k]
    return out


def first_dtype(dtypes: Sequence[str]) -> str | None:
    """The dtype of the first tensor input (what its FLOPs run in), None without one."""
    return next((d for d in dtypes if d in ELEMENT_BYTES), None)


__all__ = ["ELEMENT_BYTES", "WRAPPER", "first_dtype", "op_bytes"]
