"""Run OcrUser in a Locust LocalRunner against HOST for a few seconds; print what Locust and the
rows saw, as one JSON line. Its own process: Locust monkey-patches the interpreter at import.

    python tests/loadtest/lt_user_probe.py HOST SECONDS USERS [RunConfig field=value ...]
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
from loadtest import users  # noqa: E402
from loadtest.config import RunConfig  # noqa: E402
from loadtest.payloads import build_payloads  # noqa: E402
from loadtest.state import STATE  # noqa: E402


def main() -> None:
    host, seconds, n_users = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    fields = dict(arg.split("=", 1) for arg in sys.argv[4:])
    defaults = RunConfig()
    typed = {k: (v == "1") if isinstance(getattr(defaults, k), bool) else type(getattr(defaults, k))(v)
             for k, v in fields.items()}  # fmt: skip
    cfg = RunConfig(host=host, **typed)
    users.set_payloads(build_payloads(cfg))
    env = Environment(user_classes=[users.OcrUser], events=events, host=host)
    runner = env.create_local_runner()
    runner.start(n_users, spawn_rate=n_users)
    gevent.sleep(seconds)
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


if __name__ == "__main__":
    main()
