"""The integrations, each against the real framework (skipped where it is not installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._inductor.debug
from torch import nn

from tests.fixtures.models import tiny_resnet


def needs(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


# ----- torchprof drop-in ------------------------------------------------------------------------------
def test_torchprof_readme_example_works_unchanged() -> None:
    from layerscope.compat import torchprof

    model = tiny_resnet()
    x = torch.rand([1, 3, 64, 64])
    with torchprof.Profile(model, use_cuda=False) as prof:
        model(x)
    text = prof.display(show_events=False)
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].split(" | ")] == list(torchprof._HEADERS)
    assert lines[2].startswith("ResNet") and any(line.startswith("├── conv1") for line in lines)
    assert any(line.startswith("│├── 0") for line in lines)  # torchprof's compact guides
    conv = next(line for line in lines if line.startswith("├── conv1"))
    assert conv.rstrip().endswith("| 1")  # leaf rows carry numbers and the call count
    assert str(prof) == text

    paths = [("ResNet", "layer1", "0"), ("ResNet", "fc")]
    with torchprof.Profile(model, enabled=True, paths=paths) as prof:
        model(x)
    traces, event_lists = prof.raw()
    assert traces[0].path == ("ResNet",) and traces[0].leaf is False
    by_path = {t.path: t for t in traces}
    assert by_path[("ResNet", "fc")].leaf and isinstance(by_path[("ResNet", "fc")].module, nn.Linear)
    fc_events = event_lists[("ResNet", "fc")][0]
    assert {"aten::linear", "aten::addmm"} & {e.name for e in fc_events}
    assert all(e.cpu_time_total >= e.self_cpu_time_total for e in fc_events)
    shown = prof.display(show_events=True)
    assert "aten::addmm" in shown or "aten::linear" in shown
    conv_line = next(line for line in shown.splitlines() if line.startswith("├── conv1"))
    assert conv_line.rstrip().endswith("|")  # not a selected path: no numbers


def test_torchprof_backward_option_and_disabled() -> None:
    from layerscope.compat import torchprof

    model = tiny_resnet()
    x = torch.rand([1, 3, 64, 64])
    with torchprof.Profile(model, backward=True) as prof:
        model(x).sum().backward()
    fwd_only = prof.profile.find("fc").forward.cpu_us
    row = next(line for line in prof.display().splitlines() if line.startswith("└── fc"))
    total = row.split(" | ")[2].strip()
    assert total  # forward + backward figure
    assert prof.profile.find("fc").backward.cpu_us > 0 and fwd_only > 0
    with torchprof.Profile(model, enabled=False) as off:
        model(x)
    assert off.raw() == ([], {})


# ----- Hugging Face Transformers ------------------------------------------------------------------------
@needs("transformers")
def _train_tiny_gpt2(
    output_dir: Path,
    profiled: bool = True,
    callback_options: dict[str, Any] | None = None,
    **training: object,
) -> tuple[nn.Module, object]:
    """Six Trainer steps of a one-layer GPT-2 built from a config (no download), profiled by the
    callback over steps 2-3 (unless not ``profiled``; ``callback_options`` replace that schedule);
    returns the model and the callback."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    except ImportError as exc:  # the pinned transformers needs a newer torch than some we test on
        pytest.skip(f"transformers does not import with torch {torch.__version__}: {str(exc)[:80]}")

    from layerscope.integrations.transformers import LayerscopeCallback

    torch.manual_seed(0)
    try:
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    except ImportError as exc:  # transformers checks the torch version when a model is built
        pytest.skip(f"transformers refuses torch {torch.__version__}: {str(exc).strip()[:80]}")
    data = [
        {"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(16)
    ]
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=6,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **training,  # type: ignore[arg-type]
    )
    options = callback_options if callback_options is not None else {"wait": 1, "warmup": 1, "active": 2}
    callback = LayerscopeCallback(**options)  # type: ignore[arg-type]
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback] if profiled else []).train()
    return model, callback


def test_transformers_trainer_flight_recorder(tmp_path: Path) -> None:
    import signal

    previous = signal.getsignal(signal.SIGUSR1)
    model, callback = _train_tiny_gpt2(tmp_path, callback_options={"flight_recorder": True, "keep": 4})
    recorder = callback.recorder  # type: ignore[attr-defined]
    assert not callback.cycles and recorder.steps_seen == 6  # type: ignore[attr-defined]
    assert [s.step for s in recorder.ring] == [2, 3, 4, 5]
    assert all(len(s.forward) > 0 and len(s.backward) > 0 for s in recorder.ring)
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert not any(m._forward_hooks for m in model.modules())
    assert list((tmp_path / "layerscope").iterdir()) == []  # nothing triggered a dump


def test_transformers_trainer_callback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, callback = _train_tiny_gpt2(tmp_path)
    assert len(callback.cycles) == 1  # type: ignore[attr-defined]
    profile = callback.cycles[0].profile  # type: ignore[attr-defined]
    profile.validate()
    assert len(profile.steps) == 2
    attention = profile.find("transformer.h.0.attn")
    assert attention.forward.cpu_us > 0 and attention.backward.cpu_us > 0
    names = sorted(p.name for p in (tmp_path / "layerscope").iterdir())
    assert len(names) == 3 and all(n.startswith("rank0_steps2-3_") for n in names)
    assert [n.rsplit(".", 1)[1] for n in names] == ["html", "gz", "txt"]
    assert not any(m._forward_hooks for m in model.modules())  # hooks gone after training
    (said,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("layerscope:")]
    assert said.endswith(f" in {tmp_path / 'layerscope'}") and all(name in said for name in names)


@pytest.mark.skipif(
    not hasattr(torch._inductor.debug, "set_kernel_post_grad_provenance_tracing"),
    reason=f"torch {torch.__version__} has no Inductor provenance hook",
)
def test_transformers_trainer_with_torch_compile(tmp_path: Path) -> None:
    """torch_compile=True: the Trainer compiles the model it was given and runs the compiled wrapper,
    while the callback is handed the uncompiled model; the profile must still show its modules."""
    from torch._dynamo.utils import counters

    def dynamo_counts() -> tuple[int, int, int]:
        stats = counters["stats"]
        return stats["unique_graphs"], stats["calls_captured"], sum(counters["graph_break"].values())

    torch._dynamo.reset()
    counters.clear()
    _train_tiny_gpt2(tmp_path / "unprofiled", profiled=False, torch_compile=True)
    unprofiled = dynamo_counts()
    torch._dynamo.reset()
    counters.clear()
    _, callback = _train_tiny_gpt2(tmp_path, torch_compile=True)
    profile = callback.cycles[0].profile  # type: ignore[attr-defined]
    profile.validate()
    compiled = profile.meta.compiled
    assert compiled is not None and compiled.mapped_graph_calls == compiled.graph_calls > 0
    assert compiled.note is None
    assert profile.root.calls == 2  # the wrapper's scope: one call a step
    for path in ("transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_fc", "lm_head"):
        node = profile.find(path)
        assert node.forward.self_cpu_us > 0 and node.backward.self_cpu_us > 0, path
        assert node.forward.flops > 0, path
    assert dynamo_counts() == unprofiled  # watching and profiling compiled nothing more


# ----- Hugging Face Accelerate --------------------------------------------------------------------------
def said_saved(err: str) -> list[str]:
    """The ``layerscope: saved ... in ...`` lines an integration printed."""
    return [line for line in err.splitlines() if line.startswith("layerscope: saved")]


@needs("accelerate")
def test_accelerate_profile_kwargs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from accelerate import Accelerator
    from accelerate.utils import ProfileKwargs

    from layerscope.integrations.accelerate import profile

    kwargs = ProfileKwargs(
        activities=["cpu"],
        record_shapes=True,
        with_flops=True,
        schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1, "skip_first": 0},
        output_trace_dir=str(tmp_path / "trace"),
    )
    accelerator = Accelerator(cpu=True, kwargs_handlers=[kwargs])
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with profile(accelerator, model) as prof:
        for _ in range(5):
            optimizer.zero_grad()
            accelerator.backward(model(torch.randn(4, 8)).sum())
            optimizer.step()
            prof.step()
    assert len(prof.cycles) == 1
    p = prof.profile
    p.validate()
    assert len(p.steps) == 2 and p.find("0").forward.flops > 0 and p.find("2").backward.cpu_us > 0
    written = prof.on_trace_ready.written
    assert [w.name.split("_")[0] for w in written] == ["rank0"] * 4  # profile, trace, HTML, text
    assert any(".pt.trace.json.gz" in w.name for w in written)
    (said,) = said_saved(capsys.readouterr().err)  # where it wrote, one line for the cycle
    assert said.endswith(f" in {tmp_path / 'trace'}") and all(w.name in said for w in written)


# ----- PyTorch Lightning ---------------------------------------------------------------------------------
class FailingLinear(nn.Linear):
    """A Linear that raises in its forward while ``failing`` is set."""

    failing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.failing:
            raise ValueError("bad batch")
        return super().forward(x)


def _quiet_cpu_trainer(profiler: object, **limits: int) -> Any:
    """A Lightning Trainer on the CPU with ``profiler``, writing nothing but the profiler's files."""
    import lightning as L

    return L.Trainer(
        profiler=profiler,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **limits,
    )


def _fit_tiny_lightning_module(
    dirpath: Path,
    compile_it: bool = False,
    fail_at: int | None = None,
    built: list[object] | None = None,
    **options: object,
) -> object:
    """Seven Lightning steps of a small module, profiled over steps 2-4; returns the profiler.
    With ``fail_at``, the module's ``head`` raises ``ValueError`` in that batch's forward; the
    module and the profiler are appended to ``built``."""
    import lightning as L

    from layerscope.integrations.lightning import LayerscopeProfiler

    class TinyModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
            self.head = FailingLinear(16, 2)

        def forward(self, batch: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(batch))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            self.head.failing = batch_idx == fail_at
            return self(batch).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=4)
    schedule: dict[str, object] = {"wait": 1, "warmup": 1, "active": 3, "repeat": 1}
    profiler = LayerscopeProfiler(dirpath=dirpath, **(options or schedule))  # type: ignore[arg-type]
    trainer = _quiet_cpu_trainer(profiler, max_steps=7)
    module = TinyModule()
    if built is not None:
        built += [module, profiler]
    trainer.fit(torch.compile(module) if compile_it else module, data)
    return profiler


@needs("lightning")
def test_lightning_flight_recorder_records_every_batch(tmp_path: Path) -> None:
    profiler = _fit_tiny_lightning_module(tmp_path, flight_recorder=True, keep=5)
    recorder = profiler.recorder  # type: ignore[attr-defined]
    assert recorder.steps_seen == 7 and [s.step for s in recorder.ring] == [2, 3, 4, 5, 6]
    assert all(len(s.forward) > 0 and len(s.backward) > 0 for s in recorder.ring)
    assert list((tmp_path / "layerscope").iterdir()) == []  # nothing triggered a dump


@needs("lightning")
@pytest.mark.parametrize("flight", [True, False])
def test_lightning_exception_is_dumped_and_unhooks(tmp_path: Path, flight: bool) -> None:
    options: dict[str, object] = {"flight_recorder": True, "keep": 5} if flight else {"active": 5}
    built: list[Any] = []
    with pytest.raises(ValueError, match="bad batch"):
        _fit_tiny_lightning_module(tmp_path, fail_at=3, built=built, **options)
    module, profiler = built
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in module.modules())
    assert profiler.compile_watch is None  # Lightning never calls teardown on this path
    dumps = sorted((tmp_path / "layerscope").glob("flight-*"))
    if not flight:  # the profiling session ended; its partial cycle saved as torch's would be
        assert dumps == [] and any((tmp_path / "layerscope").iterdir())
        return
    (dump,) = dumps
    profile = ls_load_validated(dump)
    trigger = profile.trigger  # type: ignore[attr-defined]
    assert (trigger.reason, trigger.step, trigger.module) == ("exception", 3, "head")
    assert [s.step for s in profile.steps] == [0, 1, 2, 3]  # type: ignore[attr-defined]


@needs("lightning")
@pytest.mark.parametrize("flight", [True, False])
def test_lightning_end_of_data_is_no_exception(tmp_path: Path, flight: bool) -> None:
    """A ``training_step`` taking ``dataloader_iter`` ends each epoch with ``StopIteration``
    inside the batch: Lightning's flow control, neither a dump nor the end of profiling."""
    import lightning as L

    from layerscope.integrations.lightning import LayerscopeProfiler

    class IterModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 2)

        def training_step(self, dataloader_iter: Any) -> torch.Tensor:
            batch, _, _ = next(dataloader_iter)
            return self.layer(batch).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    options: dict[str, Any] = {"flight_recorder": True, "keep": 20} if flight else {"wait": 0, "active": 6}
    profiler = LayerscopeProfiler(dirpath=tmp_path, warmup=0, **options)
    trainer = _quiet_cpu_trainer(profiler, max_epochs=2)
    trainer.fit(IterModule(), torch.utils.data.DataLoader(torch.randn(16, 8), batch_size=4))
    if flight:  # 4 batches an epoch, every one a step, and nothing dumped
        assert profiler.recorder.steps_seen == 8 and profiler.recorder.dumps == []
    else:  # the schedule's 6 active steps ran across the epoch's end
        (cycle,) = profiler.cycles
        assert len(cycle.profile.steps) == 6


@needs("accelerate")
def test_accelerate_flight_recorder(tmp_path: Path) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import ProfileKwargs

    from layerscope.integrations.accelerate import flight_recorder

    AcceleratorState._reset_state(True)  # an earlier test's torch.compile setting stays in the singleton
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path / "t"))])
    model = accelerator.prepare(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    with flight_recorder(accelerator, model, keep=4) as rec:
        for _ in range(5):
            accelerator.backward(model(torch.randn(4, 8)).sum())
            rec.step()
        path = rec.dump()
    rec.flush()
    assert path.parent == tmp_path / "t"
    dump = ls_load_validated(path)
    assert [s.step for s in dump.steps] == [1, 2, 3, 4, 5] and dump.find("2").calls == 4


def ls_load_validated(path: Path) -> object:
    import layerscope as ls

    profile = ls.load(path)
    profile.validate()
    return profile


@needs("lightning")
def test_lightning_profiler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiler = _fit_tiny_lightning_module(tmp_path)
    assert len(profiler.cycles) == 1  # type: ignore[attr-defined]
    p = profiler.cycles[0].profile  # type: ignore[attr-defined]
    p.validate()
    assert len(p.steps) == 3
    assert p.find("encoder.0").type_name == "Linear" and p.find("head").backward.cpu_us > 0
    files = sorted((tmp_path / "layerscope").iterdir())
    assert [f.name.startswith("rank0_steps2-4_") for f in files] == [True, True, True]  # json.gz, html, txt
    assert "encoder" in profiler.summary()  # type: ignore[attr-defined]
    (said,) = said_saved(capsys.readouterr().err)  # where it wrote, one line for the cycle
    assert said.endswith(f" in {tmp_path / 'layerscope'}") and all(f.name in said for f in files)


@needs("accelerate")
@needs("lightning")
def test_only_the_main_process_says_where_it_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rank writes its own files, named by its global rank; only rank 0 prints the line."""
    from accelerate.utils import ProfileKwargs
    from lightning.pytorch.utilities import rank_zero_only

    from layerscope.integrations.accelerate import profile

    monkeypatch.setenv("RANK", "1")  # a second process of a torchrun job, given the same kwargs
    schedule = {"wait": 0, "warmup": 1, "active": 1, "repeat": 1, "skip_first": 0}
    kwargs = ProfileKwargs(schedule_option=schedule, output_trace_dir=str(tmp_path / "trace"))
    model = nn.Linear(4, 2)
    with profile(kwargs, model, trace=False) as prof:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            prof.step()
    assert [w.name.split("_")[0] for w in prof.on_trace_ready.written] == ["rank1"] * 3
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # Lightning's global rank, as its strategy sets it
    _fit_tiny_lightning_module(tmp_path / "lightning")
    files = sorted((tmp_path / "lightning" / "layerscope").iterdir())
    assert len(files) == 3 and all(f.name.startswith("rank1_") for f in files)
    assert said_saved(capsys.readouterr().err) == []


@needs("lightning")
@pytest.mark.skipif(
    not hasattr(torch._inductor.debug, "set_kernel_post_grad_provenance_tracing"),
    reason=f"torch {torch.__version__} has no Inductor provenance hook",
)
def test_lightning_fit_of_a_compiled_module(tmp_path: Path) -> None:
    """trainer.fit(torch.compile(module)): Lightning compiles the module's forward and training_step
    on the instance, so no scope of ours can run; the compiled kernels still reach their modules."""
    torch._dynamo.reset()
    profiler = _fit_tiny_lightning_module(tmp_path, compile_it=True)
    p = profiler.cycles[0].profile  # type: ignore[attr-defined]
    p.validate()
    compiled = p.meta.compiled
    assert compiled is not None and compiled.mapped_graph_calls == compiled.graph_calls > 0
    assert compiled.note is None
    assert p.root.calls == 3  # one compiled forward a step
    for path in ("encoder.0", "head"):
        node = p.find(path)
        assert node.forward.self_cpu_us > 0 and node.backward.self_cpu_us > 0 and node.forward.flops > 0
    assert not profiler.compile_watch  # type: ignore[attr-defined]  # the watch ended with training


def test_layerscope_works_without_the_frameworks(tmp_path: Path) -> None:
    """No framework is a dependency: with them made unimportable, layerscope still profiles."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('transformers', 'accelerate', 'lightning'):\n"
        "    sys.modules[name] = None  # any import of it now fails\n"
        "import torch, layerscope as ls, layerscope.integrations, layerscope.compat.torchprof\n"
        "m = torch.nn.Linear(4, 4)\n"
        "with ls.profile(m) as p:\n"
        "    m(torch.randn(2, 4)).sum().backward()\n"
        "p.profile.validate()\n"
        "print('ok', p.profile.root.calls)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-1000:]
    assert done.stdout.split()[-2:] == ["ok", "1"]
