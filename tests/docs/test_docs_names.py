"""The documentation names what the code accepts, and the code accepts what the documentation names:
every `python -m loadtest` flag and every Make variable is named somewhere in docs/; every flag docs/
names is one of our commands' (or a listed one of another tool's); every `make` target it names exists;
every column of the run folder is described in docs/run-folder.md. A flag added without a word in the
docs fails here, naming the page to add it to."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from docs_text import (
    DOCS,
    FLAG,
    MAKE_CALL,
    ROOT,
    code_of,
    loadtest_flags,
    make_targets,
    make_variables,
    pages,
)

# Flags of other programs the pages quote, each with the program: none of them is ours to check.
FOREIGN_FLAGS = {
    "--gpu-memory-utilization": "vllm serve (also the simulator's)",
    "--from-env-file": "kubectl create secret",
    "--for": "kubectl wait",
    "--no-heat": "the simulator's --heat, negated (argparse.BooleanOptionalAction)",
    "--strict": "mkdocs build",
}


@pytest.fixture(scope="module")
def docs() -> dict[Any, str]:
    return pages()


@pytest.fixture(scope="module")
def all_text(docs: dict[Any, str]) -> str:
    return "\n".join(docs.values())


def test_every_loadtest_flag_is_named_in_the_docs(all_text: str) -> None:
    named = set(FLAG.findall(all_text))
    missing = {flag: sorted(cmds) for flag, cmds in loadtest_flags().items() if flag not in named}
    assert not missing, (
        "flags of `python -m loadtest` named nowhere in docs/ (add each to docs/reference.md, and where a user"
        f" meets it): {missing}"
    )


def test_every_make_variable_is_named_in_the_docs(all_text: str) -> None:
    blocks, spans = code_of(all_text)
    code = blocks + "\n" + "\n".join(spans)
    missing = sorted(
        name
        for name in make_variables()
        if name not in spans and not re.search(rf"(?<![\w$]){name}=", code)  # `NAME` alone, or NAME=value
    )
    assert not missing, f"Make variables named nowhere in docs/ (add each to docs/reference.md): {missing}"


@contextlib.contextmanager
def _recording_add_argument(seen: set[str]) -> Iterator[None]:
    original = argparse.ArgumentParser.add_argument

    def add_argument(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        seen.update(a for a in args if isinstance(a, str) and a.startswith("--"))
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.add_argument = add_argument  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.add_argument = original  # type: ignore[method-assign]


def _other_commands_flags() -> set[str]:
    """Flags of our other commands, read from their parsers as they are built (each asked for --help)."""
    import analysis.__main__ as analysis_main
    import gpu_sampler.__main__ as sampler_main
    import reports.__main__ as reports_main
    from simulator.front.cli import build_parser as simulator_parser

    seen: set[str] = set()
    calls = [
        lambda: sampler_main.parse_args(["serve", "--help"]),
        lambda: reports_main.parse_report_args(["--help"]),
        lambda: reports_main.parse_compare_args(["--help"]),
        lambda: reports_main.parse_sweep_args(["--help"]),
        lambda: analysis_main.main(["--help"]),
        simulator_parser,
    ]
    with _recording_add_argument(seen), contextlib.redirect_stdout(io.StringIO()):
        for call in calls:
            with contextlib.suppress(SystemExit):
                call()
    # scripts run as files (bench/, tools/, the real-vLLM server): their add_argument calls as written
    for path in [*ROOT.glob("bench/*.py"), *ROOT.glob("tools/*.py"), *ROOT.glob("tests/realvllm/*.py")]:
        seen.update(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", path.read_text(encoding="utf-8")))
    return seen


def test_every_flag_the_docs_name_exists(docs: dict[Any, str]) -> None:
    ours = set(loadtest_flags(include_hidden=True))
    known = ours | {"--ocr-" + f[2:] for f in ours} | _other_commands_flags() | set(FOREIGN_FLAGS)
    unknown = {
        flag: sorted(p.relative_to(ROOT).as_posix() for p, text in docs.items() if flag in FLAG.findall(text))
        for text in docs.values()
        for flag in FLAG.findall(text)
        if flag not in known
    }
    assert not unknown, f"flags the docs name that no command accepts (fix the page, or the code): {unknown}"


def test_every_make_target_the_docs_name_exists(all_text: str) -> None:
    blocks, spans = code_of(all_text)
    named = set(MAKE_CALL.findall(blocks + "\n" + "\n".join(spans)))
    assert named, "the docs name no make target: the check reads nothing"
    assert not named - make_targets(), f"make targets the docs name that the Makefile lacks: {sorted(named - make_targets())}"


def test_every_column_of_the_run_folder_is_described() -> None:
    import dataclasses

    from analysis import BUCKET_COLUMNS, STEP_COLUMNS
    from runfolder.schema import Event, GpuSample, HostSample, RequestRow, ServerSample, StepRow

    page = (DOCS / "run-folder.md").read_text(encoding="utf-8")
    described = set(re.findall(r"`([a-z0-9_]+)`", page))
    columns = set(RequestRow._fields) | set(STEP_COLUMNS) | set(BUCKET_COLUMNS)
    for record in (StepRow, GpuSample, ServerSample, HostSample, Event):
        columns |= {f.name for f in dataclasses.fields(record)}
    assert not columns - described, f"run folder columns docs/run-folder.md does not describe: {sorted(columns - described)}"


def test_every_flag_of_the_sidecar_and_the_simulator_is_named_in_the_docs(all_text: str) -> None:
    import gpu_sampler.__main__ as sampler_main
    from simulator.front.cli import build_parser as simulator_parser

    seen: set[str] = set()
    with _recording_add_argument(seen), contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        sampler_main.parse_args(["serve", "--help"])
    with _recording_add_argument(seen):
        simulator_parser()
    named = set(FLAG.findall(all_text))
    assert seen, "no flag read: the check reads nothing"
    assert not seen - named - {"--help"}, (
        "flags of `python -m gpu_sampler serve` or `python -m simulator` named nowhere in docs/ (the sidecar's:"
        f" docs/reference.md; the simulator's: simulator/README.md): {sorted(seen - named - {'--help'})}"
    )
