"""transformers' Trainer calls no callback when ``train()`` raises: the flight recorder's callback
still dumps an exception that ends the process (through a chained ``sys.excepthook``) and still
comes off the model when the program catches it and trains again."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

# A one-layer GPT-2 from a config (no download) whose MLP raises in its fourth forward (step 3).
TRAINER = textwrap.dedent(
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from layerscope.integrations.transformers import LayerscopeCallback

    def trainer(out, fail_at, callback):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
        calls = [0]

        def bad_batch(module, args):
            calls[0] += 1
            if calls[0] == fail_at + 1:
                raise ValueError("bad batch")

        model.transformer.h[0].mlp.register_forward_pre_hook(bad_batch)
        data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))}
                for _ in range(16)]
        args = TrainingArguments(output_dir=out, max_steps=6, per_device_train_batch_size=2,
                                 report_to=[], use_cpu=True, save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True)
        return model, Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    """
)


def _namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    try:
        exec(TRAINER, namespace)
    except ImportError as exc:  # the pinned transformers needs a newer torch than some we test on
        pytest.skip(f"transformers does not import with torch {torch.__version__}: {str(exc)[:80]}")
    return namespace


def test_an_exception_ending_the_process_is_dumped(tmp_path: Path) -> None:
    script = TRAINER + textwrap.dedent(
        f"""
        import sys

        def programs_own_hook(kind, value, tb):  # a crash reporter's (Sentry, rich): still called
            print("the program's hook saw", kind.__name__, file=sys.stderr)
            sys.__excepthook__(kind, value, tb)

        sys.excepthook = programs_own_hook
        _, run = trainer({str(tmp_path)!r}, 3, LayerscopeCallback(flight_recorder=True, keep=5))
        run.train()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the program's hook saw ValueError" in done.stderr
    assert done.stderr.rstrip().endswith("ValueError: bad batch")  # Python's own report, as before
    (dump,) = sorted((tmp_path / "layerscope").glob("flight-*"))
    import layerscope as ls

    profile = ls.load(dump)
    profile.validate()
    trigger = profile.trigger  # type: ignore[attr-defined]
    # the pre-hook raises before the MLP's forward runs: the innermost forward it passed is the block's
    assert (trigger.reason, trigger.step, trigger.module) == ("exception", 3, "transformer.h.0")
    assert [s.step for s in profile.steps] == [0, 1, 2, 3]  # type: ignore[attr-defined]


@pytest.mark.parametrize("flight", [True, False])
def test_a_caught_failure_is_ended_by_the_next_train(tmp_path: Path, flight: bool) -> None:
    from layerscope.integrations.transformers import LayerscopeCallback

    hook, handler = sys.excepthook, signal.getsignal(signal.SIGUSR1)
    options: dict[str, Any] = {"flight_recorder": True, "keep": 5} if flight else {"active": 2}
    callback = LayerscopeCallback(**options)
    model, run = _namespace()["trainer"](str(tmp_path), 3, callback)
    with pytest.raises(ValueError, match="bad batch"):
        run.train()
    # the recorder's hook is still chained: train() died without telling the callback
    assert (sys.excepthook is not hook) == flight
    run.train()  # the hook raised once; this run goes through, and ends the first one's leftovers
    assert sys.excepthook is hook and signal.getsignal(signal.SIGUSR1) is handler
    mlp = model.transformer.h[0].mlp
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules() if m is not mlp)
    assert [hook.__name__ for hook in mlp._forward_pre_hooks.values()] == ["bad_batch"]  # the test's own
    assert callback.compile_watch is None
    if flight:
        assert callback.recorder.steps_seen == 6
        # the first train()'s recorder dumped what it kept when the second started; the exception
        # was gone (caught above), and with it what names the module (scopes close as it passes)
        (dump,) = sorted((tmp_path / "layerscope").glob("flight-*"))
        message = "TrainAbandoned: the previous train() raised; the program caught the exception"
        _assert_dumped(dump, message, None)
    else:
        assert len(callback.cycles) == 1
        callback.cycles[0].profile.validate()


def test_the_hook_steps_aside_for_one_chained_over_it() -> None:
    from layerscope.integrations.uncaught import UncaughtHook

    seen: list[BaseException] = []
    original = sys.excepthook
    ours = UncaughtHook(seen.append)
    ours.install()
    try:
        theirs = lambda *args: ours.hook(*args)  # noqa: E731 - a library chaining over ours
        sys.excepthook = theirs
        ours.remove()
        assert sys.excepthook is theirs  # theirs stays; ours passes everything through
        printed: list[object] = []
        ours._previous = lambda *args: printed.append(args[1])  # type: ignore[assignment]
        error = ValueError("x")
        sys.excepthook(ValueError, error, None)
        assert seen == [] and printed == [error]
    finally:
        sys.excepthook = original


def _assert_dumped(dump: Path, message: str, module: str | None = "transformer.h.0") -> None:
    import layerscope as ls

    profile = ls.load(dump)
    profile.validate()
    trigger = profile.trigger  # type: ignore[attr-defined]
    assert (trigger.reason, trigger.step, trigger.module, trigger.message) == (
        "exception",
        3,
        module,
        message,
    )
    assert [s.step for s in profile.steps] == [0, 1, 2, 3]  # type: ignore[attr-defined]


def test_a_retry_inside_except_dumps_the_exception_itself(tmp_path: Path) -> None:
    from layerscope.integrations.transformers import LayerscopeCallback

    callback = LayerscopeCallback(flight_recorder=True, keep=5)
    _, run = _namespace()["trainer"](str(tmp_path), 3, callback)
    try:
        run.train()
    except ValueError:
        run.train()  # the program retries while it holds the error: the dump names it
    (dump,) = sorted((tmp_path / "layerscope").glob("flight-*"))
    _assert_dumped(dump, "ValueError: bad batch")
