"""CLI: python -m analysis RUN_DIR [--headroom 0.7] [--slo-p95-s 2.0]

Exit codes: 0 written; 2 a user error (bad flag, missing or corrupt run folder), one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analysis.table.loader import RunFolderError
from analysis.written.outputs import (
    CAPACITY_FILE,
    CONFIG_FILE,
    STEPS_CSV,
    SUMMARY_FILE,
    gateway_why,
    write_outputs,
)
from runfolder import GATEWAY_FILE


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; pass e.g. --headroom 0.7") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is outside (0, 1]; pass e.g. --headroom 0.7")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds; pass e.g. --slo-p95-s 2.0"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive; pass e.g. --slo-p95-s 2.0")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description="Analyse a run folder.")
    parser.add_argument("run_dir", help="the run folder, results/<run-id>")
    parser.add_argument("--headroom", type=_fraction, default=None, help="share of GPU memory to plan with")
    parser.add_argument("--slo-p95-s", type=_seconds, default=None, help="P95 latency objective in seconds")
    args = parser.parse_args(argv)
    try:
        summary = write_outputs(args.run_dir, headroom=args.headroom, slo_p95_s=args.slo_p95_s)
    except (RunFolderError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    level = summary["recommended_level"]
    print(f"{summary['knee']['reason']}")
    print(f"recommended max_concurrency: {level if level is not None else 'none'}")
    for name in (SUMMARY_FILE, STEPS_CSV, CAPACITY_FILE, CONFIG_FILE):
        print(f"wrote {args.run_dir.rstrip('/')}/{name}")
    why = gateway_why(summary)
    print(f"no {GATEWAY_FILE}: {why}" if why else f"wrote {args.run_dir.rstrip('/')}/{GATEWAY_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
