"""The terminal's lines at a glance (loadtest/method/glance.py): at most GLANCE_CHARS, the detail named
where it lies; "at most" only beside an "about" it does not dwarf."""

from __future__ import annotations

from loadtest.method.glance import GLANCE_CHARS, first_clause, fit, promise_words

REASON = ("floor((24576 MiB x 0.7 - 5800 MiB idle) / 1114 MiB per request) = 10; memory per request: the"
          " baseline's peak is one request above idle")  # fmt: skip
DISTRUST = ("the KV-cache estimate 10 is no level: it counts the requests whose tokens fit in the cache, and nothing"
            " says the server runs that many at once (its /metrics exports no max_num_seqs; set MAX_NUM_SEQS to cap"
            " it): doubling until the knee")  # fmt: skip


def test_the_first_clause_is_the_reason_without_its_explanation() -> None:
    assert first_clause(REASON) == "floor((24576 MiB x 0.7 - 5800 MiB idle) / 1114 MiB per request) = 10"
    assert first_clause(DISTRUST) == "the KV-cache estimate 10 is no level"
    assert first_clause("x0.25..x1.2 of the estimate 10") == "x0.25..x1.2 of the estimate 10"


def test_a_line_fits_and_names_where_the_rest_is() -> None:
    short = fit(f"gpu_memory: estimate=10 ({first_clause(REASON)})", "capacity.md")
    assert short == ("gpu_memory: estimate=10 (floor((24576 MiB x 0.7 - 5800 MiB idle) / 1114 MiB per request) = 10);"
                     " more: capacity.md")  # fmt: skip
    long = fit("levels: " + ", ".join(str(2**i) for i in range(40)), "events.jsonl")
    assert len(long) <= GLANCE_CHARS and long.endswith("...; more: events.jsonl")
    assert long.split("...")[0].endswith(tuple("0123456789"))  # cut between words, never inside a number


def test_at_most_is_said_only_near_about() -> None:
    assert promise_words("about 5 min as planned", 300, 900, 15) == "about 5 min as planned, at most 15 min"
    assert promise_words("about 70 s as planned", 70, 68 * 60, 68) == "about 70 s as planned"  # the line


def test_a_clause_alone_is_cut_without_a_tail() -> None:
    cut = fit(first_clause(DISTRUST) + " and more words than fit", limit=30)
    assert len(cut) <= 30 and cut.endswith("...") and "more:" not in cut


def test_paths_are_shown_relative_to_the_users_folder_where_they_lie_under_it(tmp_path, monkeypatch) -> None:
    from runfolder import SHOWN_FROM_ENV, shown_path

    run = tmp_path / "results" / "20261206-1" / "report.html"
    assert shown_path(run, str(tmp_path)) == "results/20261206-1/report.html"
    assert shown_path(run, str(tmp_path / "elsewhere")) == str(run)  # not under it: as it is
    monkeypatch.delenv(SHOWN_FROM_ENV, raising=False)
    assert shown_path(run) == str(run)  # no folder given: never a guess
    monkeypatch.setenv(SHOWN_FROM_ENV, str(tmp_path))
    assert shown_path(run) == "results/20261206-1/report.html"
