"""What the documentation says, read the way a test can check it: the pages of docs/ (with the files they
include through `--8<--` snippets), their code (fenced blocks and inline spans), the flags and `make`
targets they name; and what the code accepts: every flag of our parsers, the Makefile's variables and
targets."""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MAKEFILE = ROOT / "Makefile"

SNIPPET = re.compile(r'^--8<--\s+"([^"]+)"\s*$', re.M)
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
# a long flag: --word or --word-word, not inside a longer token (not ---, not a-b--c)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")
MAKE_CALL = re.compile(r"(?<![\w-])make ([a-z][a-z0-9-]*)")


def pages() -> dict[Path, str]:
    """Each page's text with its snippets expanded (simulator.md includes simulator/README.md)."""
    return {
        p: SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"), p.read_text(encoding="utf-8"))
        for p in sorted(DOCS.rglob("*.md"))
    }


def code_of(text: str) -> tuple[str, list[str]]:
    """(the fenced blocks joined, the inline code spans outside them)."""
    blocks = "\n".join(FENCE.findall(text))
    return blocks, INLINE.findall(FENCE.sub("", text))


def _actions(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for _, a in _actions(sub):
                    yield name, a
        elif action.option_strings:
            yield parser.prog.split()[-1], action


def loadtest_flags(include_hidden: bool = False) -> dict[str, set[str]]:
    """Every long flag `python -m loadtest` accepts -> the commands that take it (argparse's --help left
    out; hidden ones, filled by the runner, only when asked)."""
    from loadtest.commands import verify
    from loadtest.commands.main import build_parser

    flags: dict[str, set[str]] = {}
    for parser, command in ((build_parser(), None), (verify.build_parser(), "verify")):
        for name, action in _actions(parser):
            if action.help == argparse.SUPPRESS and not include_hidden and "--window-s" not in action.option_strings:
                continue  # --ca-bundle-pem, --verify-rate-rps: set by the runner (verify's --window-s is real)
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    flags.setdefault(flag, set()).add(command or name)
    return flags


def make_variables() -> set[str]:
    """The Makefile's variables a user sets (tools/make_variables.py reads them for make's own check)."""
    spec = importlib.util.spec_from_file_location("make_variables", ROOT / "tools" / "make_variables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    documented: set[str] = module.documented(MAKEFILE.read_text(encoding="utf-8"))
    return documented


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", MAKEFILE.read_text(encoding="utf-8"), re.M))
