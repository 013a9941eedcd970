"""The command line, in-process through main(argv) and once as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import layerscope as ls
from layerscope.cli import build_parser, main

FACTORY = str(Path(__file__).parent / "fixtures" / "factory.py")


def test_profile_factory_file_saves_and_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json.gz"
    code = main(
        [
            "profile",
            f"{FACTORY}:small_mlp",
            "--input",
            "4x8",
            "--steps",
            "2",
            "--memory",
            "-o",
            str(out),
            "--top",
            "5",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Sequential" in printed and "Top 5 ops by self_cpu_us" in printed
    p = ls.load(out)
    p.validate()
    assert p.find("0").calls == 2 and p.find("0").type_name == "Linear"
    assert p.meta.capture.options.memory is True


def test_show_renders_saved_profile_with_view_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    assert main(["profile", f"{FACTORY}:small_mlp", "--input", "4x8", "-q", "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert main(["show", str(out), "--depth", "0", "--top", "0", "--ascii"]) == 0
    printed = capsys.readouterr().out
    assert "(root)" in printed and "|-- 0" not in printed  # depth 0: children folded
    assert main(["show", str(out), "--group-by", "shapes", "--op-sort", "calls"]) == 0
    assert "Input shapes" in capsys.readouterr().out


def test_builtin_gpt_eval(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "gpt", "--eval", "--input", "2x16:int64", "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "TinyGPT" in printed and "blocks" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "no_such_module_xyz:f", "--input", "2x2"], "cannot import 'no_such_module_xyz'"),
        (["profile", f"{FACTORY}:missing", "--input", "2x2"], "has no callable named 'missing'"),
        (["profile", f"{FACTORY}:not_a_model", "--input", "2x2"], "returned str, not a torch.nn.Module"),
        (["profile", "nonsense"], "bad FACTORY 'nonsense'"),
        (["profile", f"{FACTORY}:small_mlp"], "give the model's input shape"),
        (["profile", f"{FACTORY}:small_mlp", "--input", "4xq"], "bad --input shape '4xq'"),
        (["profile", f"{FACTORY}:small_mlp", "--input", "4x8:int8"], "unknown dtype 'int8'"),
        (["profile", f"{FACTORY}:small_mlp", "--input", "4x8", "--sort", "speed"], "--sort 'speed'"),
        (["profile", f"{FACTORY}:small_mlp", "--input", "4x8", "--device", "cuda:0"], "CUDA"),
        (["profile", "missing_file.py:f", "--input", "2x2"], "does not exist"),
        (["show", "/no/such/run.json"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if "cuda" in " ".join(argv):
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_shape_mismatch_is_reported_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", f"{FACTORY}:small_mlp", "--input", "4x3"]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError" in err and "Traceback" not in err and "-v" in err
    assert main(["-v", "profile", f"{FACTORY}:small_mlp", "--input", "4x3"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_subprocess_entry_points(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "layerscope",
            "profile",
            f"{FACTORY}:small_mlp",
            "--input",
            "4x8",
            "-o",
            str(out),
            "--ascii",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "|-- 0" in done.stdout and out.exists()
    bad = subprocess.run(
        [sys.executable, "-m", "layerscope", "show", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_help_documents_every_option_with_examples(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("profile", "run"):
        for action in commands[name]._actions:
            assert action.help, f"{name} {action.option_strings or action.metavar} has no help line"
        text = help_text([name, "-h"], capsys)
        examples = text[text.index("examples:") :].splitlines()[1:]
        assert len(examples) >= 3
        for line in examples:  # every example is a command line the parser accepts
            argv = line.split("#")[0].split()
            if argv[0] == "torchrun":
                argv = argv[argv.index("layerscope") :]
            parser.parse_args(argv[1:])
    run_help = help_text(["run", "-h"], capsys)
    assert "-o PATH" in run_help and "a folder or a file" in run_help
    assert "docs/integrations/" in help_text(["-h"], capsys)
