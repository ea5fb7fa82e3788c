"""One vocabulary on every screen (issue 52): "step N" for a position in steps.jsonl, "load N of M" among the
loads, "N users" for a load, one plateau figure (the knee's) rounded alike. The panel's, the report's and the
terminal's strings are searched for the old forms a newcomer stumbled on: a report and its answer lines
rendered from a synthetic run, the phase names and notes the console prints, and the panel's own page."""

from __future__ import annotations

import html
import itertools
import re
import sys
from importlib import resources
from pathlib import Path

import pytest

from analysis import analyze, load_run
from loadtest.method.live import level_label, phase_name
from loadtest.method.plan import _step, plan_phases
from loadtest.method.timing import warmup_bounds
from loadtest.settings.limits import limits_of
from loadtest.settings.run_config import RunConfig
from reports.answer import answer_lines, plateau_line
from reports.output import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

OLD_FORMS = {  # the old form -> what says it now
    r"knee at level \d": "knee at N users",
    r"\blevel \d+ of \d+": "load N of M",
    r"\blevel \d+, (step|warmup|cooldown)": "load N: step (U users)",
    r"over level \d+'s": "over N users'",
    r"\blevels? \d+ \(\d+%\)|\bat levels \d|and level \d": "the driver's CPU at N users (P%)",
    r"\blevel \d+ (reaches|only)": "N users reach / only",
    r"(?<!at most )\b\d+ rounds x \d+ requests": "at most R rounds x N requests (the baseline ends early)",
    r"warm-up for \d+(?! users?\b)": "warm-up for N users",
    r"latenc(y|ies) at \d+ from P50": "latency at N users, from the P50 ... at M users",
    r"[+-]0% over": "about the same as",
    r"-\d+% over": "N% under",
    r"rps at level \d|to level \d": "at N users (the fall's and the steady loss's words)",
    r"smallest level that reaches it": "the fewest users that reach it",
    r"ms at level \d": "P95 ... ms at N users (the config's comments)",
    r": (\d+)-\1 s\b": "one number when both ends round alike",
    r"\(\d+(\.\d+)?x the plateau [\d.]+ rps\) until": "the plan's rate: x the highest step's rps",
    r"plateau: \d+\.\d rps": "rates to two decimals, as the knee's reason gives them",
    r"ui: stopping: a run in progress stops": "the run named, or 'no run in progress'",
    r"`ui` ended": "no literal backticks on the panel",
}


def old_forms(text: str) -> list[str]:
    return [f"{pattern} (now: {now}): {m.group(0)!r}" for pattern, now in OLD_FORMS.items()
            for m in [re.search(pattern, text)] if m]  # fmt: skip


@pytest.mark.parametrize("text", [
    "knee at level 10 (step 14): throughput 13.89 rps is +0% over level 8's 13.79 rps", "level 5 of 5, verify",
    "3 rounds x 20 requests", "warm-up for 3: 1 latency at 3 from P50 338 ms at 1: 1-1 s", "plateau: 13.8 rps",
    "ui: stopping: a run in progress stops", "at the baseline (92%) and level 8 (92%)", "Driver saturated at levels 8, 10", "(`ui` ended, or", "verify: 20.83 rps (1.5x the plateau 13.89 rps) until",
    "throughput 13.16 rps is -5% over 8 users'", "13.79 rps at level 8, down 40%", "from the baseline to level 10",
])  # fmt: skip
def test_each_old_form_is_caught(text: str) -> None:
    assert old_forms(text), text  # the search itself finds what the issue quoted


def test_the_report_and_its_answer_lines_say_it_the_new_way(tmp_path: Path) -> None:
    run_dir = synth_run(tmp_path / "run", levels=(2, 4, 6, 8, 12), true_knee=6)
    summary = analyze(load_run(run_dir))
    lines = "\n".join(answer_lines(summary))
    assert "knee at 8 users (step" in lines and not old_forms(lines), lines
    plateau = summary["knee"]["plateau_rps"]
    assert plateau_line(summary).startswith(f"plateau: {plateau:.2f} rps"), plateau_line(summary)
    page = write_report(run_dir).read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", page, flags=re.S)))
    assert not old_forms(text), old_forms(text)


def test_the_consoles_phase_names_and_notes_say_it_the_new_way() -> None:
    cfg = RunConfig(levels="2,4", baseline_rounds=3, baseline_round_requests=20)
    said = [level_label(phase, 8, 2, 5) for phase in ("warmup", "step", "cooldown", "verify", "drain")]
    assert said[1] == "load 2 of 5: step (8 users)" and said[3] == "verify (8 users)", said
    said += [phase_name(None, [2, 4], finished=True, aborted=a, planned=[2, 4], knee_level=None,
                        before_baseline=False) for a in (True, False)]  # fmt: skip
    first = itertools.islice(plan_phases(cfg, lambda: None, lambda: None, lambda: None), 3)  # type: ignore[arg-type,return-value]
    said += [spec.note for spec in first] + [spec.note for spec in _step(cfg, 3, "level 3")]
    limits = limits_of(cfg)
    said += [warmup_bounds(3, [(1, 338.0)], limits, 30.0).why, warmup_bounds(2, [(1, 338.0), (4, 900.0)], limits, 30.0).why]
    assert "at most 3 rounds x 20 requests" in said and "warm-up for 3 users" in said, said
    assert not old_forms("\n".join(said)), old_forms("\n".join(said))


@pytest.mark.parametrize("source", ["loadtest/views/static/panel.html", "loadtest/commands/ui.py",
                                    "loadtest/method/decisions.py", "loadtest/views/webui.py",
                                    "loadtest/views/panel_runs.py"])  # fmt: skip
def test_the_panels_and_the_terminals_own_strings_say_it_the_new_way(source: str) -> None:
    package, _, name = source.rpartition("/")
    text = resources.files(package.replace("/", ".").removesuffix(".static")).joinpath(
        "static/" + name if package.endswith("static") else name).read_text(encoding="utf-8")  # fmt: skip
    # the f-strings' placeholders stand for numbers
    assert not old_forms(re.sub(r"\{[^{}]*\}", "8", text)), old_forms(re.sub(r"\{[^{}]*\}", "8", text))


def test_the_drivers_warning_names_loads_in_users() -> None:
    from analysis.table.driver import DriverLoad

    for busy in (DriverLoad(((2, 1, 92.0), (5, 8, 92.0)), 2, (2,)), DriverLoad(((5, 4, 88.0), (8, 8, 91.0)), 2, ())):
        said = [busy.where(), busy.where(with_cpu=True), busy.words(), busy.advice(2)]
        assert all("users" in text for text in said) and not old_forms("\n".join(said)), said
