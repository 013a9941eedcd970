"""The module catalog's parameter counts and sources, against what torch's own calls give."""

from __future__ import annotations

from torch import nn

from layerscope.capture.module_catalog import forward_source, global_catalog, model_catalog, param_counts


class Tied(nn.Module):
    """An embedding and a head sharing one weight, a block registered twice, a parameter of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        block = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([block, nn.ReLU(), block])
        self.scale = nn.Parameter(nn.init.ones_(nn.Linear(1, 3).weight.detach().clone()))
        self.register_parameter("absent", None)  # a None entry, as optional parameters leave
        self.register_module("missing", None)


def _torch_counts(module: nn.Module) -> tuple[int, int]:
    own = sum(p.numel() for p in module.parameters(recurse=False))
    return own, sum(p.numel() for p in module.parameters())


def test_param_counts_match_torch_on_shared_tensors_and_modules() -> None:
    model = Tied()
    counts = param_counts([model])
    for name, module in model.named_modules(remove_duplicate=False):
        assert counts[id(module)] == _torch_counts(module), name
    assert counts[id(model)][1] == 40 + 20 + 3  # the tied weight and the twice-registered block once


def test_model_catalog_own_params_exclude_kept_children_and_sources_per_class() -> None:
    model = Tied()
    modules = {"": model, "embed": model.embed, "blocks.0": model.blocks[0]}
    infos = {info.path: info for info in model_catalog(modules, {})}
    assert infos[""].params_total == 63
    # the root's own: everything no kept descendant counts (the head's weight is the embedding's)
    assert infos[""].params == 63 - 40 - 20
    assert infos["blocks.0"].source == forward_source(nn.Linear(1, 1))
    assert infos["embed"].source is not None and infos["embed"].source.endswith(
        f":{nn.Embedding.forward.__code__.co_firstlineno}"
    )


def test_global_catalog_counts_each_called_module() -> None:
    model = Tied()
    called = {"Tied": model, "Tied.blocks.0": model.blocks[0]}
    infos = {info.path: info for info in global_catalog(called, {"Tied"}, {})}
    assert infos[""].params_total == 63
    assert (infos["Tied"].params, infos["Tied"].params_total) == (3, 63)
    assert (infos["Tied.blocks.0"].params, infos["Tied.blocks.0"].params_total) == (20, 20)
