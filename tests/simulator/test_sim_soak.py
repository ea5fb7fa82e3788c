"""The soak's servers (issue 50): memory that each answered request leaves behind (the leak fault) and
latency that grows with the server's age (latency_drift_pct_per_min), each with its truth."""

from __future__ import annotations

import pytest

from simulator import PROFILES, truth
from simulator.front.cli import build_parser, config_from_args
from simulator.model.options import Options, make_options
from simulator.model.pipeline import Finished, Pipeline
from simulator.model.profiles import ProfileError
from simulator.model.work import work_of
from simulator.truth import creep_mib_per_h, hours_to_full, latency_factor

PT = PROFILES["pytorch-24g"]


def _one_request_ms(options: Options, at_ms: float) -> float:
    """The latency of one request arriving alone at `at_ms` after the server's start."""
    pipe = Pipeline(PT, options)
    pipe.submit(1, work_of(PT, options, 1000, 700, None), at_ms)
    done = [o for o in pipe.advance(at_ms + 600_000.0) if isinstance(o, Finished)]
    return done[0].e2e_ms


def test_latency_grows_with_the_servers_age_as_the_truth_says() -> None:
    drifting = Options(latency_drift_pct_per_min=20.0)
    fresh = _one_request_ms(drifting, 0.0)
    assert fresh == pytest.approx(_one_request_ms(Options(), 0.0), rel=0.01)  # it ages 0.3 s while served
    later = _one_request_ms(drifting, 5 * 60_000.0)  # five minutes in: steps x 2.0
    t = truth("pytorch-24g", 1000, 700, latency_drift_pct_per_min=20.0)
    assert latency_factor(t, 5.0) == pytest.approx(2.0)
    # the GPU part doubles; the host part of a step does not, so the request is a little under x 2
    assert 1.8 * fresh < later <= 2.0 * fresh
    assert t.latency_drift_pct_per_min == 20.0 and t.knee_concurrency == truth("pytorch-24g", 1000, 700).knee_concurrency


def test_the_truth_of_a_leak_is_its_creep_and_the_hours_to_full() -> None:
    t = truth("pytorch-24g", 1000, 700, leak_mib_per_request=2.0)
    assert t.leak_mib_per_request == 2.0
    assert creep_mib_per_h(t, served_rps=10.0) == pytest.approx(72_000.0)
    assert hours_to_full(t, t.total_mib - 7_200.0, served_rps=10.0) == pytest.approx(0.1)
    steady = truth("pytorch-24g", 1000, 700)
    assert creep_mib_per_h(steady, 10.0) == 0.0 and hours_to_full(steady, 5000.0, 10.0) is None


def test_drift_and_leak_are_flags() -> None:
    argv = ["--latency-drift-pct-per-min", "12.5", "--leak-mib-per-request", "3"]
    config = config_from_args(build_parser().parse_args(argv))
    assert config.options.latency_drift_pct_per_min == 12.5 and config.faults.leak_mib_per_request == 3.0
    with pytest.raises(ProfileError, match="--latency-drift-pct-per-min"):
        make_options(latency_drift_pct_per_min=-1.0)
