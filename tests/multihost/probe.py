"""Run inside a lab namespace: `python probe.py URL` prints the simulator's served count (the sum of
`vllm:request_success`) read from URL/metrics, trusting $MH_CA when set and sending $MH_TOKEN as a
bearer token when set (from the environment: never on a command line)."""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def served(url: str) -> float:
    ctx = ssl.create_default_context(cafile=os.environ.get("MH_CA") or None)
    req = urllib.request.Request(url + "/metrics")
    if os.environ.get("MH_TOKEN"):
        req.add_header("Authorization", f"Bearer {os.environ['MH_TOKEN']}")
    text = urllib.request.urlopen(req, timeout=5, context=ctx).read().decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:request_success":  # every request the engine finished, by finished_reason
            total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return total


if __name__ == "__main__":
    print(int(served(sys.argv[1])))
