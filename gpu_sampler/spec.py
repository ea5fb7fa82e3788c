"""The GPU spec a run is given (`GPU=`): "none" | "nvml[:SEL]" | "sidecar:URL[#SEL]" | "dcgm:URL[#SEL]" |
"server-metrics" | "fake".

SEL names the server's GPUs (`0`, `0,1`, `GPU-<uuid>`, `MIG-<uuid>`; see `gpu_sampler.selection`). A bad spec
is one `SamplerError` line naming the forms, before anything is read.
"""

from __future__ import annotations

from gpu_sampler.errors import SamplerError
from gpu_sampler.selection import GpuSelection, parse_selection, split_source
from gpu_sampler.triton_gpu import SOURCE as SERVER_GPU

SPEC_FORMS = (
    "none, nvml (every GPU), nvml:0, nvml:0,1, nvml:GPU-<uuid>, sidecar:http://HOST:9410[#0], "
    "dcgm:http://HOST:9400/metrics[#0,1], server-metrics (Triton's own GPU series at SERVER_METRICS) or fake"
)


def parse_gpu_spec(spec: str) -> tuple[str, str | None, GpuSelection]:
    """(kind, URL or None, the server's GPUs); a bad spec is a one-line `SamplerError` naming the forms."""
    text = (spec or "").strip()
    if text in ("none", "nvml", "fake", SERVER_GPU):
        return text, None, GpuSelection()
    kind, _, rest = text.partition(":")
    if kind == "nvml" and rest:
        return kind, None, parse_selection(rest, "GPU=nvml:")
    url, selection = split_source(rest)
    if kind in ("sidecar", "dcgm") and url.startswith(("http://", "https://")) and len(url) > 8:
        if kind == "sidecar" and selection.uuids:
            raise SamplerError(
                f"GPU={text}: the sidecar's samples carry indices, not UUIDs: use #0 here, "
                "or --source nvml:GPU-<uuid> on the sidecar"
            )
        return kind, url, selection
    raise SamplerError(f"bad GPU spec {spec!r}: use {SPEC_FORMS}")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """("none"|"nvml"|"fake", None) or ("sidecar"|"dcgm", URL); a bad spec is a one-line `SamplerError`."""
    kind, url, _selection = parse_gpu_spec(spec)
    return kind, url
