"""Run OcrUser in a Locust LocalRunner against HOST for a few seconds; print what Locust and the
rows saw, as one JSON line. Its own process: Locust monkey-patches the interpreter at import.

    python tests/loadtest/lt_user_probe.py HOST SECONDS USERS [RunConfig field=value ...] [_option=value ...]

Options of the probe itself (a leading "_"): `_stop_timeout=S` (Locust's --stop-timeout), and
`_step_down_to=N` with `_then_s=S`: after SECONDS, step down to N users as a shape would, wait S seconds.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import gevent
from locust import events
from locust.env import Environment

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from loadtest.settings.checks import parse_optional_float
from loadtest.settings.run_config import RunConfig  # noqa: E402
from loadtest.traffic import users  # noqa: E402
from loadtest.traffic.payloads import build_payloads  # noqa: E402
from loadtest.traffic.state import STATE  # noqa: E402


def main() -> None:
    host, seconds, n_users = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    fields = dict(arg.split("=", 1) for arg in sys.argv[4:])
    probe = {k[1:]: float(v) for k, v in fields.items() if k.startswith("_")}
    defaults = RunConfig()
    typed = {k: _typed(getattr(defaults, k), v) for k, v in fields.items() if not k.startswith("_")}
    cfg = RunConfig(host=host, **typed)
    users.set_payloads(build_payloads(cfg))
    env = Environment(
        user_classes=[users.OcrUser], events=events, host=host, stop_timeout=probe.get("stop_timeout")
    )
    runner = env.create_local_runner()
    runner.start(n_users, spawn_rate=n_users)
    gevent.sleep(seconds)
    if "step_down_to" in probe:
        runner.start(int(probe["step_down_to"]), spawn_rate=100)
        gevent.sleep(probe.get("then_s", 0.2))
    runner.quit()
    rows = STATE.take_rows()
    total = env.stats.total
    errors: Counter[str] = Counter()
    for err in env.stats.errors.values():
        errors[str(err.error).split(":", 1)[0].removeprefix("CatchResponseError('")] += err.occurrences
    print(
        json.dumps(
            {
                "locust_requests": total.num_requests,
                "locust_failures": total.num_failures,
                "locust_bytes": total.total_content_length,
                "locust_errors": errors,
                "locust_names": sorted(str(name) for name, _method in env.stats.entries),
                "rows": [r._asdict() for r in rows],
            }
        )
    )


def _typed(default: object, text: str) -> object:
    if isinstance(default, bool):
        return text == "1"
    if default is None:  # an optional number (cer_fail_above)
        return parse_optional_float(text, "value")
    return type(default)(text)


if __name__ == "__main__":
    main()
