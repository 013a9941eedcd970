"""Models compiled before they are profiled: ``layerscope.watch_compiles()``, its environment
variable, ``layerscope run``, the Trainer and Lightning integrations, compiled submodules and
compiled functions. Each compiles once (seconds), so scenarios share module-scoped fixtures.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch._inductor.debug
from torch import nn
from torch._dynamo.utils import counters

import layerscope as ls
from layerscope.capture import compile_watch
from layerscope.capture.compile_watch import CompileWatch
from tests.fixtures.models import WideAmongNarrow
from tests.test_compile import _dynamo_counts, _inputs

pytestmark = pytest.mark.skipif(
    not hasattr(torch._inductor.debug, "set_kernel_post_grad_provenance_tracing"),
    reason=f"torch {torch.__version__} has no Inductor provenance hook",
)

REPO = Path(__file__).resolve().parents[1]
HEAVIEST = "wide.mid"
STEPS = 2


def _train(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, steps: int = STEPS) -> None:
    for _ in range(steps):
        call(x).sum().backward()


@dataclass
class Compiled:
    """One model compiled before its profile: its profile and Dynamo's counters around it."""

    profile: ls.Profile
    counts_before: dict[str, int]  # after the warm-up that compiled it
    counts_after: dict[str, int]  # after the profiled steps
    unwatched_counts: dict[str, int]  # the same program compiled with no watch
    outputs_equal: bool  # the watched compile computes what the unwatched one does


def _compile_then_profile(
    build: Callable[[nn.Module], tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module]],
) -> Compiled:
    """Compile ``build(model)`` (returns what to call and what to profile) and warm it up: once
    unwatched (the baseline), once after ``watch_compiles()``; then profile the watched one."""
    torch.manual_seed(0)
    weights = WideAmongNarrow()
    x = _inputs()
    torch._dynamo.reset()
    counters.clear()
    call, _ = build(copy.deepcopy(weights))
    _train(call, x)
    unwatched = _dynamo_counts()
    with torch.no_grad():
        expected = call(x)

    torch._dynamo.reset()
    counters.clear()
    compile_watch.forget_graphs()
    with CompileWatch():
        call, profiled = build(copy.deepcopy(weights))
        _train(call, x)  # compiled here, before the profile
        before = _dynamo_counts()
        with ls.profile(profiled) as session:
            _train(call, x)
        after = _dynamo_counts()
        with torch.no_grad():
            equal = torch.equal(call(x), expected)
    return Compiled(session.profile, before, after, unwatched, equal)


def _whole(model: nn.Module) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module]:
    compiled = torch.compile(model)
    return compiled, compiled


def _function(model: nn.Module) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module]:
    @torch.compile
    def step(x: torch.Tensor) -> torch.Tensor:
        return model(x) * 2.0

    return step, model


# (A model compiled by the Trainer while the profile is handed the uncompiled one: test_integrations.)
@pytest.fixture(scope="module", params=["whole", "function"])
def compiled(request: pytest.FixtureRequest) -> Iterator[Compiled]:
    build = {"whole": _whole, "function": _function}[request.param]
    yield _compile_then_profile(build)


def test_a_model_compiled_before_the_profile_gets_its_modules(compiled: Compiled) -> None:
    profile = compiled.profile
    profile.validate()
    assert profile.meta.compiled.mapped_graph_calls == profile.meta.compiled.graph_calls > 0
    assert profile.meta.compiled is not None and profile.meta.compiled.note is None
    mid = profile.find(HEAVIEST)
    assert mid.type_name == "Linear" and mid.calls == STEPS
    assert mid.forward.self_cpu_us > 0 and mid.backward.self_cpu_us > 0
    assert mid.forward.flops == STEPS * 2 * 1024**3  # 1024 rows through a 1024 -> 1024 Linear
    assert profile.root.calls == STEPS
    leaves = {n.path: n.total.cpu_us for n in profile.modules() if not n.children}
    assert max(leaves, key=leaves.__getitem__) == HEAVIEST


def test_watching_changes_nothing_in_the_compiled_program(compiled: Compiled) -> None:
    assert compiled.counts_before == compiled.unwatched_counts  # same graphs, same breaks
    assert compiled.counts_after == compiled.counts_before  # profiling compiled nothing again
    assert compiled.unwatched_counts["graph_breaks"] == 0
    assert compiled.outputs_equal


def test_the_watch_is_undone() -> None:
    import torch._inductor.config as inductor_config

    assert not compile_watch._watch.on
    assert inductor_config.fx_graph_cache is True and inductor_config.cpp.enable_kernel_profile is False
    name = "set_kernel_post_grad_provenance_tracing"
    assert getattr(torch._inductor.debug, name).__module__ == "torch._inductor.debug"


def _run_python(code: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    full_env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'src'}", **(env or {})}
    done = subprocess.run(
        [sys.executable, *args, str(script)], capture_output=True, text=True, env=full_env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_environment_variable_watches_lazily_from_import(tmp_path: Path) -> None:
    out = _run_python(
        """
        import json, sys
        import torch
        import layerscope as ls
        from layerscope.capture import compile_watch
        from tests.fixtures.models import WideAmongNarrow

        waiting = compile_watch._watch.on and not compile_watch._watch.collecting
        inductor_imported = "torch._inductor.codegen.cpp" in sys.modules
        model = torch.compile(WideAmongNarrow())
        x = torch.randn(256, 32)
        model(x).sum().backward()  # compiles here, before the profile
        with ls.profile(model) as session:
            model(x).sum().backward()
        mid = session.profile.find("wide.mid")
        print(json.dumps({
            "waiting": waiting, "inductor_imported": inductor_imported,
            "collecting": compile_watch._watch.collecting, "restored": torch.compile.__module__,
            "forward": mid.forward.self_cpu_us, "backward": mid.backward.self_cpu_us,
        }))
        """,
        tmp_path,
        env={"LAYERSCOPE_WATCH_COMPILES": "1"},
    )
    found = json.loads(out.strip().splitlines()[-1])
    # until torch.compile is called nothing of Inductor is imported; then it watches
    assert found["waiting"] and not found["inductor_imported"] and found["collecting"]
    assert found["restored"] == "torch"  # only the first torch.compile passed through layerscope
    assert found["forward"] > 0 and found["backward"] > 0


def test_a_watch_where_dynamo_is_loaded_installs_at_the_first_compile(tmp_path: Path) -> None:
    """Libraries such as transformers load Dynamo without compiling: a watch (and a profile) started
    there must not import Inductor's code generators (about 1 s) until something compiles, and must
    still place what compiles later."""
    out = _run_python(
        """
        import json, sys
        import torch
        import torch._dynamo  # as transformers does on import
        import layerscope as ls
        from layerscope.capture.compile_watch import CompileWatch
        from tests.fixtures.models import WideAmongNarrow

        watch = CompileWatch().start()
        with ls.profile(WideAmongNarrow()):  # a profile in such a process, nothing compiled
            pass
        before = "torch._inductor.codegen.cpp" in sys.modules
        model = torch.compile(WideAmongNarrow())  # (imports the code generators itself)
        x = torch.randn(256, 32)
        model(x).sum().backward()
        with ls.profile(model) as session:
            model(x).sum().backward()
        watch.stop()
        compiled = session.profile.meta.compiled
        print(json.dumps({
            "imported_before": before, "imported_after": "torch._inductor.codegen.cpp" in sys.modules,
            "mapped": compiled.mapped_graph_calls, "calls": compiled.graph_calls,
            "forward": session.profile.find("wide.mid").forward.self_cpu_us,
        }))
        """,
        tmp_path,
    )
    found = json.loads(out.strip().splitlines()[-1])
    assert not found["imported_before"] and found["imported_after"]
    assert found["mapped"] == found["calls"] > 0 and found["forward"] > 0


TRAIN_SCRIPT = """
import torch
from tests.fixtures.models import WideAmongNarrow

torch.manual_seed(0)
model = torch.compile(WideAmongNarrow())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 32)
model(x).sum().backward()  # the warm-up compiles the model, before any recorded step
optimizer.zero_grad()
for _ in range(4):
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
print("trained")
"""


def test_layerscope_run_gives_the_eager_tree_of_a_script_that_compiles_first(tmp_path: Path) -> None:
    saved = tmp_path / "run.json.gz"
    out = _run_python(
        TRAIN_SCRIPT, tmp_path, "-m", "layerscope", "run", "-q", "--steps", "2", "-o", str(saved)
    )
    assert "trained" in out
    profile = ls.load(saved)
    profile.validate()
    assert profile.meta.compiled.mapped_graph_calls == profile.meta.compiled.graph_calls > 0
    mid = profile.find(f"WideAmongNarrow.{HEAVIEST}")
    assert mid.type_name == "Linear"
    assert mid.forward.self_cpu_us > 0 and mid.backward.self_cpu_us > 0
    assert mid.forward.flops == 2 * 2 * 256 * 1024 * 1024  # two recorded steps, 256 rows, 1024 -> 1024
    assert not any("_orig_mod" in n.path or n.type_name == "OptimizedModule" for n in profile.modules())


class _WithCompiledEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.compile(nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 32)))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_a_compiled_submodule_shows_its_inner_modules() -> None:
    torch._dynamo.reset()
    model = _WithCompiledEncoder()
    with ls.profile(model) as session:  # compiled inside the block, watched by the profile itself
        _train(model, _inputs())
    profile = session.profile
    profile.validate()
    encoder = profile.find("encoder")
    assert encoder.type_name == "Sequential" and [c.path for c in encoder.children] == [
        "encoder.0",
        "encoder.1",
        "encoder.2",
    ]
    assert profile.meta.compiled.kernels_placed > 0
    first = profile.find("encoder.0")
    assert first.forward.self_cpu_us > 0 and first.backward.self_cpu_us > 0
    assert first.forward.flops == STEPS * 2 * 1024 * 32 * 512
    assert not any("_orig_mod" in n.path for n in profile.modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_layerscope_profile_watches_its_warm_up(tmp_path: Path) -> None:
    from layerscope.cli import main

    torch._dynamo.reset()
    saved = tmp_path / "p.json.gz"
    factory = str(REPO / "tests" / "fixtures" / "factory.py")
    assert main(["profile", f"{factory}:compiled_mlp", "--input", "4x8", "-q", "-o", str(saved)]) == 0
    profile = ls.load(saved)
    assert profile.meta.compiled.mapped_graph_calls == profile.meta.compiled.graph_calls > 0
    first = profile.find("0")
    assert first.type_name == "Linear" and first.forward.self_cpu_us > 0 and first.backward.self_cpu_us > 0


def test_watches_stopped_in_any_order_give_torch_compile_back() -> None:
    original = torch.compile
    first, second = CompileWatch(), CompileWatch()
    if compile_watch.should_collect():  # Dynamo is in use in this process: watches collect at once
        first.start(lazy=True), second.start(lazy=True)
    else:
        first.start(), second.start()
    first.stop()
    second.stop()
    assert torch.compile is original
    assert not first.on and not second.on and not compile_watch._installation.holders


def test_a_compiled_loss_outside_the_model_stays_out_of_it() -> None:
    """A graph call outside every module goes to the model only where the model itself ran no scope
    of its own; here the model ran eagerly and the compiled loss is someone else's."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    @torch.compile
    def loss(y: torch.Tensor) -> torch.Tensor:
        return (y * y).mean()

    x = _inputs()
    with ls.profile(model) as session:
        for _ in range(2):
            loss(model(x)).backward()
    profile = session.profile
    profile.validate()
    assert profile.root.calls == 2  # the model's own calls, none added by the loss's graph calls
    assert profile.meta.compiled.kernels_placed == 0
