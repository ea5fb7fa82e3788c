"""The run folder: the one contract between stages (DESIGN.md section 4).

Stdlib only, so every stage may import it: the writers (loadtest, gpu_sampler) and the
readers (analysis, reports) agree on file names and columns here and nowhere else.
"""

from runfolder.schema import (
    EVENTS_FILE,
    GATEWAY_FILE,
    GATEWAY_VARIANT_FILE,
    GPU_FILE,
    HOST_FILE,
    MANIFEST_FILE,
    REQUESTS_FILE,
    SCHEMA_VERSION,
    SERVER_FILE,
    STEPS_FILE,
    Event,
    GpuSample,
    HostSample,
    Phase,
    RequestRow,
    ServerSample,
    StepRow,
    columns_of,
)
from runfolder.sink import (
    CLOSED_KEY,
    SHOWN_FROM_ENV,
    CsvAppender,
    JsonlAppender,
    new_run_folder,
    read_manifest,
    run_closed,
    shown_path,
    write_manifest,
)

__all__ = [
    "CLOSED_KEY",
    "SHOWN_FROM_ENV",
    "EVENTS_FILE",
    "GATEWAY_FILE",
    "GATEWAY_VARIANT_FILE",
    "GPU_FILE",
    "HOST_FILE",
    "MANIFEST_FILE",
    "REQUESTS_FILE",
    "SCHEMA_VERSION",
    "SERVER_FILE",
    "STEPS_FILE",
    "CsvAppender",
    "Event",
    "GpuSample",
    "HostSample",
    "JsonlAppender",
    "Phase",
    "RequestRow",
    "ServerSample",
    "StepRow",
    "columns_of",
    "new_run_folder",
    "shown_path",
    "read_manifest",
    "run_closed",
    "write_manifest",
]
