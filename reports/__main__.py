"""CLI: `python -m reports RUN_DIR`, `python -m reports compare A B [--out PATH] [--fail-if-worse]`,
`python -m reports sweep DIR`.

Prints the run's answer (reports/answer.py), then `config:`, `gateway:` and `report: <path>` last, on success;
`compare` prints its verdict line (reports/verdict.py) before `report:`, and with --fail-if-worse exits 1
when B is worse than A (a CI gate). A user error (missing or corrupt folder) prints one line to stderr and
exits 2; nothing else is caught, so a bug still shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from reports.answer import answer_lines
from reports.output import ReportError, compare_folders, gateway_note, write_report
from reports.sweep import write_sweep
from reports.verdict import verdict_line
from runfolder import shown_path

USER_ERROR_EXIT = 2
WORSE_EXIT = 1  # compare --fail-if-worse: B is worse than A


def parse_report_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m reports",
        description="Render report.html for a run folder (or `compare A B` for two runs).",
    )
    parser.add_argument("run_dir", help="a results/<run-id> folder")
    parser.add_argument("--headroom", type=float, default=None, help="fraction of GPU memory to plan for")
    parser.add_argument("--slo-p95-s", type=float, default=None, help="P95 latency objective, seconds")
    return parser.parse_args(argv)


def parse_compare_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reports compare", description="Two runs side by side.")
    parser.add_argument("a", help="first run folder (e.g. before a change)")
    parser.add_argument("b", help="second run folder (e.g. after it)")
    parser.add_argument("--out", default=None, help="output HTML path (default: B/compare-<A>.html)")
    parser.add_argument("--fail-if-worse", action="store_true",
                        help="exit 1 when B's plateau or recommended level is worse than A's (a CI gate)")  # fmt: skip
    return parser.parse_args(argv)


def parse_sweep_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m reports sweep",
        description="sweep.csv, sweep.html and recommended-config.yaml for a sweep folder (partial ones too).",
    )
    parser.add_argument("sweep_dir", help="a <OUT>/sweep-<time> folder")
    return parser.parse_args(argv)


def user_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ReportError]
    try:
        from analysis import RunFolderError

        errors.append(RunFolderError)
    except ImportError:
        pass
    return tuple(errors)


def print_answer(report: Path) -> None:
    """The answer, then where the config and the gateway are: the last lines but `report:`."""
    from analysis.written.outputs import CONFIG_FILE, GATEWAY_FILE, SUMMARY_FILE

    folder = report.parent
    try:
        summary = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict):
        print("\n".join(answer_lines(summary)))
        if isinstance(summary.get("soak"), dict):  # a soak held a level it was given: no config of its own to point at
            return
    config = folder / CONFIG_FILE
    if config.is_file():
        print(f"config: {shown_path(config)}")
    gateway = folder / GATEWAY_FILE
    note = f"gateway: {shown_path(gateway)}" if gateway.is_file() else gateway_note(folder)
    if note:
        print(note)


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    status = 0
    try:
        if args_in[:1] == ["compare"]:
            args = parse_compare_args(args_in[1:])
            path, verdict = compare_folders(args.a, args.b, args.out)
            print(verdict_line(verdict))
            status = WORSE_EXIT if args.fail_if_worse and verdict.worse else 0
        elif args_in[:1] == ["sweep"]:
            args = parse_sweep_args(args_in[1:])
            path = write_sweep(args.sweep_dir)
        else:
            args = parse_report_args(args_in)
            path = write_report(args.run_dir, headroom=args.headroom, slo_p95_s=args.slo_p95_s)
            print_answer(path)
    except user_errors() as exc:
        print(f"reports: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(f"report: {shown_path(path)}")
    if status == WORSE_EXIT:
        print("reports: B is worse than A: exit 1 (--fail-if-worse)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
