"""Which class of kernel an aten op runs, for the measured CPU's cost model (``cpu_bench.py``
measures each class once; ``op_costs.py`` prices an op by its class).

A class groups ops whose kernels do alike work per byte or per FLOP: ``matmul``, ``conv`` and
``conv_backward`` (FLOP-bound: priced by FLOPs), and the memory classes (priced by bytes read plus
written): ``elementwise`` (arithmetic that streams: add, mul, copies, ReLU, the optimizer's
ops; also any op no class names; ``elementwise_`` when it writes in place, as the optimizer's
updates do: no output to allocate), ``transcendental`` (GELU, SiLU, tanh, exp: more work per
element than a copy), ``reduction`` (sum, mean, max over a dimension), ``softmax``, ``layer_norm``,
``batch_norm``, ``indexed`` (masked fills, ``where``, embeddings, gathers: a mask or an index read
beside the data) and ``pool`` (max pooling: a window read per output). Each is measured with one
representative op, named in :data:`REPRESENTATIVES`.
"""

from __future__ import annotations

#: Classes priced by their FLOPs (at fp32; other dtypes scaled by the spec's peaks).
COMPUTE_CLASSES = ("matmul", "conv", "conv_backward")
#: Classes priced by the bytes their ops read and write.
MEMORY_CLASSES = (
    "elementwise",
    "elementwise_",
    "transcendental",
    "reduction",
    "softmax",
    "layer_norm",
    "batch_norm",
    "indexed",
    "pool",
)
#: The class an op none of :data:`MEMBERS` names falls into.
DEFAULT_CLASS = "elementwise"

#: The op each class is measured with (what ``cpu_bench.py`` runs; documentation).
REPRESENTATIVES = {
    "matmul": "aten::mm (square fp32)",
    "conv": "aten::convolution (3x3, 64 channels)",
    "conv_backward": "aten::convolution_backward (the same convolution)",
    "elementwise": "aten::add (two tensors, a new output)",
    "elementwise_": "aten::add_ (in place)",
    "transcendental": "aten::gelu",
    "reduction": "aten::sum over the last dimension",
    "softmax": "aten::_softmax over the last dimension",
    "layer_norm": "aten::native_layer_norm",
    "batch_norm": "aten::native_batch_norm (training)",
    "indexed": "aten::masked_fill with a broadcast mask",
    "pool": "aten::max_pool2d_with_indices (3x3, stride 2)",
}

_ATEN = "aten::"

#: Ops by class (names without ``aten::``); in-place and ``out`` forms are found by their base name.
MEMBERS: dict[str, frozenset[str]] = {
    "matmul": frozenset(
        {
            "mm",
            "addmm",
            "bmm",
            "baddbmm",
            "addbmm",
            "addmv",
            "mv",
            "dot",
            "_addmm_activation",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_attention_math",
        }
    ),
    "conv": frozenset({"convolution", "_convolution", "mkldnn_convolution"}),
    "conv_backward": frozenset({"convolution_backward"}),
    "transcendental": frozenset(
        {
            "gelu",
            "gelu_backward",
            "silu",
            "silu_backward",
            "tanh",
            "tanh_backward",
            "sigmoid",
            "sigmoid_backward",
            "exp",
            "log",
            "erf",
            "sin",
            "cos",
            "mish",
            "elu",
            "elu_backward",
            "softplus",
            "softplus_backward",
            "log_sigmoid_forward",
            "log_sigmoid_backward",
        }
    ),
    "reduction": frozenset(
        {
            "sum",
            "mean",
            "amax",
            "amin",
            "max",
            "min",
            "var",
            "std",
            "var_mean",
            "std_mean",
            "norm",
            "linalg_vector_norm",
            "argmax",
            "argmin",
            "prod",
            "logsumexp",
            "_adaptive_avg_pool2d",
            "_adaptive_avg_pool2d_backward",
            "cumsum",
        }
    ),
    "softmax": frozenset(
        {
            "_softmax",
            "_log_softmax",
            "_safe_softmax",
            "_softmax_backward_data",
            "_log_softmax_backward_data",
        }
    ),
    "layer_norm": frozenset(
        {"native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward"}
    ),
    "batch_norm": frozenset(
        {
            "native_batch_norm",
            "native_batch_norm_backward",
            "_native_batch_norm_legit",
            "_native_batch_norm_legit_functional",
            "_native_batch_norm_legit_no_training",
            "batch_norm_backward",
        }
    ),
    "indexed": frozenset(
        {
            "masked_fill",
            "where",
            "embedding",
            "embedding_dense_backward",
            "index_select",
            "index",
            "index_put",
            "index_add",
            "gather",
            "scatter",
            "scatter_add",
            "nll_loss_forward",
            "nll_loss_backward",
            "nll_loss2d_forward",
            "nll_loss2d_backward",
        }
    ),
    "pool": frozenset(
        {
            "max_pool2d_with_indices",
            "max_pool2d_with_indices_backward",
            "max_pool3d_with_indices",
            "max_pool3d_with_indices_backward",
            "avg_pool2d",
            "avg_pool2d_backward",
        }
    ),
}

_BY_NAME = {op: cls for cls, ops in MEMBERS.items() for op in ops}


def op_class(name: str) -> str:
    """The class of an aten op by its name (``aten::gelu_`` is ``gelu``'s, ``aten::add`` is
    :data:`DEFAULT_CLASS`'s, ``aten::add_`` its in-place form's)."""
    base = name.removeprefix(_ATEN)
    found = _BY_NAME.get(base) or _BY_NAME.get(base.rstrip("_"))
    if found:
        return found
    return DEFAULT_CLASS + "_" if base.endswith("_") else DEFAULT_CLASS
