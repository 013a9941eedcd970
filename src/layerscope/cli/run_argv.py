"""Where ``layerscope run``'s own options end: at the script or ``-m MODULE``, as for ``python``.

``layerscope run --steps 3 -m pkg.train --lr 3e-4 -q`` gives ``--lr 3e-4 -q`` to ``pkg.train``, as
``python -m pkg.train --lr 3e-4 -q`` would; argparse alone cannot say so (it takes any ``-q`` or
``--steps`` it meets as its own, and ``--lr`` as an error), so the command line is split before it
parses ours.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import cache


@cache
def _options() -> dict[str, bool]:
    """``run``'s option strings, each with whether it takes a value."""
    from layerscope.cli.run_cmd import add_arguments

    parser = argparse.ArgumentParser(prog="layerscope run")
    add_arguments(parser)
    # argparse has no public table of its options; the actions list is stable across versions
    return {name: action.nargs != 0 for action in parser._actions for name in action.option_strings}


def _lookup(option: str) -> bool | None:
    """Whether ``option`` takes a value (None: not one of ours); unique prefixes of long options
    count, as argparse accepts them."""
    options = _options()
    if option in options:
        return options[option]
    matches = [name for name in options if option.startswith("--") and name.startswith(option)]
    return options[matches[0]] if len(matches) == 1 else None


def _target_start(tokens: Sequence[str]) -> tuple[int, int] | None:
    """(end of our options, start of the target) in the tokens after ``run``; None when no target
    is named (argparse then says what is missing)."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":  # the script comes next, even one named like an option
            return i, i + 1
        if token == "-m" or (token.startswith("-m") and not token.startswith("--")):
            return (i, i) if token != "-m" or i + 1 < len(tokens) else None
        if not token.startswith("-") or token == "-":
            return i, i
        name = token.split("=", 1)[0]
        takes_value = _lookup(name)
        if takes_value is None and not token.startswith("--") and _lookup(token[:2]) is not None:
            takes_value = False  # a short option with its value attached (-oruns) or a cluster
        i += 2 if takes_value and "=" not in token else 1
    return None


def split_run_command_line(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """For ``[global options] run [ours] (script.py | -m MODULE | -- script.py) [theirs]``: the
    command line for our parser (``-m MODULE`` kept in it) and the target's arguments (the script
    first; for a module, what follows it). Any other command line comes back unchanged, with None."""
    tokens = list(argv)
    command = next((i for i, token in enumerate(tokens) if not token.startswith("-")), None)
    if command is None or tokens[command] != "run":
        return tokens, None
    found = _target_start(tokens[command + 1 :])
    if found is None:
        return tokens, None
    end, start = (command + 1 + k for k in found)
    if start == len(tokens):  # "run ... --" and nothing after it
        return tokens[:end], None
    first = tokens[start]
    if start == end and first == "-m":
        return [*tokens[:end], "-m", tokens[start + 1]], tokens[start + 2 :]
    if start == end and first.startswith("-m"):  # -mpkg, as python accepts it
        return [*tokens[:end], "-m", first[2:]], tokens[start + 1 :]
    return tokens[:end], tokens[start:]
