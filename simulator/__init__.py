"""The simulated GPU OCR server: a real HTTP server whose latency, memory and errors follow a documented
model with a known ground truth (`truth`). Run it with `python -m simulator --profile pytorch-24g`."""

from simulator.model.closed_loop import CurvePoint
from simulator.model.options import Options
from simulator.model.profiles import DEFAULT_PROFILE, PROFILES, Profile
from simulator.truth import Truth, truth

__all__ = ["DEFAULT_PROFILE", "PROFILES", "CurvePoint", "Options", "Profile", "Truth", "truth"]
