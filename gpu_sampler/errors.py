"""The one exception a user of gpu_sampler sees: its message is one line that names the fix."""

from __future__ import annotations


class SamplerError(ValueError):
    """A bad spec, an unreachable source or a broken driver; `str(err)` is one line naming the fix."""
