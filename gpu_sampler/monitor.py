"""The facade the Locust master uses: one GPU source from a spec, plus server metrics and host samples.

Spec: "none" | "nvml[:SEL]" | "sidecar:URL[#SEL]" | "dcgm:URL[#SEL]" | "server-metrics" (the server's own
GPU series on its /metrics, Triton's nv_gpu_*: gpu_sampler.triton_gpu) | "fake" (a deterministic local fake
GPU, for demos). SEL names the server's GPUs (`0`, `0,1`, `GPU-<uuid>`, `MIG-<uuid>`; see
`gpu_sampler.selection`); without it every GPU the source sees counts as the server's.
- Producers run in real OS threads (`Sampler`s for nvml/dcgm/fake, server /metrics and this host; a
  poller for the sidecar) and only append to deques, which need no lock and no gevent.
- Callbacks (`on_gpu`, `on_server`, `on_host`, `on_event`) run in the caller's world: a greenlet when
  gevent has patched the process (the Locust master), else a plain thread; every `deliver_interval_s`,
  and once more in `stop()`. A failing callback is logged once and never stops the monitor.
- A source that stops answering during the run gives one Event "sampler_gap" and, when it answers
  again, "sampler_back"; nothing raises after `check()`.
- The sidecar poller pulls `/samples` from a cursor every `scrape_interval_s`, starting at the
  sidecar's newest sample; a new `boot_id` (the sidecar restarted) resets the cursor and marks the step
  again. Step marks are sent at once by `mark_step()` and re-sent by the poller when the sidecar lost it.
- "none" samples no GPU; the driver host (and the server's /metrics when given) are still sampled.
- `tls` (gpu_sampler.tls.TlsSettings) applies to the sidecar, the DCGM exporter and /metrics alike;
  `metrics_headers` go with the DCGM and /metrics scrapes (the sidecar has its own token).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from gpu_sampler.client import SidecarClient
from gpu_sampler.errors import SamplerError
from gpu_sampler.readers import DcgmReader, FakeGpuReader, HostReader, NvmlReader, ServerMetricsReader
from gpu_sampler.realthread import RealThread, flush_logs, gevent_patched, real_sleep
from gpu_sampler.sampler import Sampler
from gpu_sampler.selection import own_mem_mib
from gpu_sampler.spec import parse_gpu_spec
from gpu_sampler.tls import TlsSettings
from gpu_sampler.triton_gpu import SOURCE as SERVER_GPU
from gpu_sampler.triton_gpu import ServerGpuReader
from runfolder import Event, GpuSample, HostSample, ServerSample

log = logging.getLogger(__name__)

NONE_WHY = "GPU=none: no GPU source was asked for"
PAGE = 5000


def _ignore(_item: Any) -> None:
    return None


class GpuMonitor:
    def __init__(
        self,
        spec: str,
        *,
        server_metrics_url: str | None = None,
        framework_metric: str = "",
        step_of: Callable[[], int] = lambda: -1,
        on_gpu: Callable[[list[GpuSample]], None] = _ignore,
        on_server: Callable[[list[ServerSample]], None] = _ignore,
        on_host: Callable[[list[HostSample]], None] = _ignore,
        on_event: Callable[[Event], None] = _ignore,
        nvml_interval_s: float = 0.05,
        scrape_interval_s: float = 0.5,
        pid: int | None = None,
        token: str | None = None,
        metrics_headers: Mapping[str, str] | None = None,
        tls: TlsSettings | None = None,
        clock: Callable[[], float] = time.time,
        gpu_reader: Any = None,
        host_reader: Any = None,
        deliver_interval_s: float = 0.25,
    ) -> None:
        self.kind, self.url, self.selection = parse_gpu_spec(spec)
        self._check_server_metrics(server_metrics_url)
        self.step_of, self.clock, self.scrape_interval_s = step_of, clock, scrape_interval_s
        self._start_delivery(deliver_interval_s, gpu=on_gpu, server=on_server, host=on_host, event=on_event)
        self._latest_mem: dict[int, float | None] = {}
        self._card: int | None = None  # the server's card once chosen (use_card)
        self._info: dict[str, Any] | None = None
        self._why_missing: str | None = NONE_WHY if self.kind == "none" else None
        self._metrics_headers, self._tls = metrics_headers, tls or TlsSettings()
        self.gpu_reader = gpu_reader or self._make_gpu_reader(pid)
        self._open_http_readers(token, server_metrics_url, framework_metric)
        self.samplers: list[Sampler] = []
        self._sampler_of: dict[str, Sampler] = {}  # by the queue it fills
        self._add_samplers(nvml_interval_s, host_reader or HostReader("driver"))
        self._start_poller_state()

    def _check_server_metrics(self, server_metrics_url: str | None) -> None:
        """An http(s) URL for the server's /metrics, the GPU's source too with GPU=server-metrics."""
        if server_metrics_url is not None and not server_metrics_url.startswith(("http://", "https://")):
            raise SamplerError(f"bad server metrics URL {server_metrics_url!r}: use http://HOST:PORT/metrics")
        if self.kind == SERVER_GPU:
            if not server_metrics_url:
                raise SamplerError("GPU=server-metrics reads the server's own /metrics: set SERVER_METRICS=http://HOST:8002/metrics")
            self.url = server_metrics_url

    def _start_delivery(self, deliver_interval_s: float, **callbacks: Callable[[Any], None]) -> None:
        """A queue per callback, which the producers fill and the deliverer empties (not started yet)."""
        self._callbacks: dict[str, Callable[[Any], None]] = dict(callbacks)
        self._queues: dict[str, deque[Any]] = {k: deque() for k in self._callbacks}
        self._deliver_interval_s = deliver_interval_s
        self._stopping = False
        self._failed_callbacks: set[str] = set()
        self._deliverer: Any = None

    def _open_http_readers(self, token: str | None, server_metrics_url: str | None, framework_metric: str) -> None:
        """The sidecar's client (with GPU=sidecar:URL) and the server's /metrics reader (with its URL)."""
        self.client = (
            SidecarClient(self.url, token=token, tls=self._tls) if self.kind == "sidecar" and self.url else None
        )
        self.server_reader = (
            ServerMetricsReader(
                server_metrics_url, framework_metric=framework_metric, headers=self._metrics_headers, tls=self._tls
            )
            if server_metrics_url
            else None
        )

    def _start_poller_state(self) -> None:
        """The sidecar poller's state: nothing read, no step marked yet."""
        self._cursor: int | None = None
        self._boot_id: str | None = None
        self._wanted_step: int | None = None
        self._sidecar_step: int | None = None
        self._sidecar_ok: bool | None = None
        self._poller: RealThread | None = None

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> GpuMonitor:
        """Build from a spec (see the module docstring); keywords as `__init__`'s."""
        return cls(spec, **kwargs)

    def _make_gpu_reader(self, pid: int | None) -> Any:
        if self.kind == "nvml":
            return NvmlReader(self.selection, pid=pid)
        if self.kind == "dcgm" and self.url:
            return DcgmReader(self.url, selection=self.selection, headers=self._metrics_headers, tls=self._tls)
        if self.kind == SERVER_GPU and self.url:
            return ServerGpuReader(self.url, headers=self._metrics_headers, tls=self._tls)
        if self.kind == "fake":
            return FakeGpuReader(clock=self.clock, step_of=self.step_of)
        return None

    def _add_samplers(self, nvml_interval_s: float, host_reader: Any) -> None:
        """One sampler per local source: the GPU (a DCGM page at the scrape pace), /metrics, this host."""
        if self.gpu_reader is not None:
            interval = self.scrape_interval_s if self.kind in ("dcgm", SERVER_GPU) else nvml_interval_s
            self._add_sampler(self.gpu_reader, interval, "gpu", f"GPU ({self.kind})")
        if self.server_reader is not None:
            self._add_sampler(self.server_reader, self.scrape_interval_s, "server", "server metrics")
        self._add_sampler(host_reader, self.scrape_interval_s, "host", "driver host")

    def _add_sampler(self, reader: Any, interval_s: float, queue: str, label: str) -> None:
        def sink(records: list[Any]) -> None:
            self._queues[queue].append(records)
            if queue == "gpu":
                self._note_gpu(records)

        sampler = Sampler(
            reader,
            interval_s,
            clock=self.clock,
            step_of=self.step_of,
            sink=sink,
            ring_size=16,
            on_health=lambda ok, message: self._gap_or_back(label, ok, message),
            name=f"{queue}-sampler",
        )
        self.samplers.append(sampler)
        self._sampler_of[queue] = sampler

    # --- before the run -----------------------------------------------------------------------------
    def check(self) -> None:
        """Read each source once; raise a one-line `SamplerError` if one is unreachable or broken."""
        try:
            if self.client is not None:
                self.client.health()
                info = self.client.info()
                if not info.get("available", True):
                    raise SamplerError(
                        f"GPU sidecar at {self.url} cannot read its GPU ({info.get('why_missing')}): "
                        "fix the driver there, or use GPU=none"
                    )
                self._info = info
            elif self.gpu_reader is not None:
                check = getattr(self.gpu_reader, "check", None) or self.gpu_reader.read
                check()
                self._info = self._describe_local()
        except SamplerError as err:
            self._why_missing = str(err)
            raise
        if self.server_reader is not None:
            self.server_reader.read()

    def _describe_local(self) -> dict[str, Any]:
        describe = getattr(self.gpu_reader, "describe", None)
        return dict(describe()) if describe is not None else {}

    def info(self) -> dict[str, Any]:
        """source, url, name, total_mib, driver, gpu_count, available, why_missing."""
        if self._info is None and self.kind != "none" and self._why_missing is None:
            try:
                self._info = self.client.info() if self.client is not None else self._describe_local()
            except SamplerError as err:
                self._why_missing = str(err)
            except Exception as err:  # an odd reader; info() must not raise
                self._why_missing = f"{type(err).__name__}: {err}"
        base: dict[str, Any] = {
            "name": None,
            "total_mib": None,
            "driver": None,
            "gpu_count": None,
            "gpus": None,
            "memory_call": None,
        }
        found = self._info or {}
        base.update({k: found[k] for k in base if k in found})
        base.update(self._selected_of(found))
        base["selection"] = self.selection.text() or "all"
        available = self._info is not None and bool(found.get("available", True))
        why = None if available else (self._why_missing or found.get("why_missing") or "no answer yet")
        return base | {"source": self.kind, "url": self.url, "available": available, "why_missing": why}

    def _selected_of(self, found: dict[str, Any]) -> dict[str, Any]:
        """A sidecar reading more GPUs than GPU=sidecar:URL#... names: the total of the named ones."""
        gpus = found.get("gpus")
        if self.client is None or self.selection.everything or not isinstance(gpus, list):
            return {}
        kept = [g for g in gpus if self.selection.takes(int(g.get("gpu_index", -1)))]
        totals = [g.get("total_mib") for g in kept]
        total = sum(totals) if kept and None not in totals else None
        return {"gpus": kept, "gpu_count": len(kept), "total_mib": total}

    def server_gpus(self, samples: list[GpuSample]) -> list[GpuSample]:
        """The samples of the server's GPUs only (a sidecar may read more than GPU=...#sel names)."""
        return [s for s in samples if self.selection.takes(s.gpu_index)]

    # --- during the run -----------------------------------------------------------------------------
    def start(self) -> GpuMonitor:
        self._stopping = False
        for sampler in self.samplers:
            sampler.start()
        if self.client is not None:
            self._poller = RealThread(self._poll_loop, "sidecar-poller")
            self._poller.start()
        self._start_deliverer()
        return self

    def mark_step(self, step_index: int) -> None:
        """Tell the sidecar a step starts now (no-op for local sources, which read `step_of`)."""
        self._wanted_step = step_index
        if self.client is None or self._sidecar_ok is False:
            return  # the poller marks it when the sidecar answers again
        try:
            self.client.mark_step(step_index)
            self._sidecar_step = step_index
        except SamplerError as err:
            log.warning("could not mark step %s on the sidecar: %s", step_index, err)

    def read_soon(self) -> None:
        """The GPU and the server's metrics read at once rather than at their next tick (a cooldown waits for
        readings taken after its drain); the sidecar's poller is left to its pace."""
        for queue in ("gpu", "server"):
            if queue in self._sampler_of:
                self._sampler_of[queue].read_soon()

    def latest_mem_used_mib(self) -> float | None:
        """The server's GPU memory now (MiB): its card's once `use_card` named it (its own memory, other
        processes' left out where known), else summed over the GPUs sampled (the rule of `combine_gpus`);
        None before any sample, without a GPU, or while one of them gives no memory reading."""
        if self._card is not None:
            return self._latest_mem.get(self._card)
        values = list(self._latest_mem.values())
        if not values or any(v is None for v in values):
            return None
        return sum(v for v in values if v is not None)

    def use_card(self, gpu_index: int | None) -> None:
        """The server's card, chosen after the baseline when GPU= names none (analysis.table.server_card);
        None: every GPU sampled counts again."""
        self._card = gpu_index

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling and deliver what is left, in the caller."""
        self._stopping = True
        for sampler in self.samplers:
            sampler.stop(timeout_s)
        if self._poller is not None:
            self._poller.join(timeout_s)
        self._stop_deliverer(timeout_s)
        self.deliver()

    # --- internals ----------------------------------------------------------------------------------
    def _note_gpu(self, records: list[Any]) -> None:
        for r in records:
            if isinstance(r, GpuSample):
                self._latest_mem[r.gpu_index] = own_mem_mib(r)

    def _event(self, kind: str, message: str) -> None:
        self._queues["event"].append(
            Event(t_unix_s=self.clock(), step_index=self.step_of(), kind=kind, message=message)
        )

    def _gap_or_back(self, label: str, ok: bool, message: str) -> None:
        if ok:
            self._event("sampler_back", f"{label} samples are back")
        else:
            self._event("sampler_gap", f"{label} samples stopped: {message}")

    def _poll_loop(self) -> None:
        sleep = real_sleep()
        while not self._stopping:
            full = self._poll_once()
            if not full:
                deadline = time.monotonic() + self.scrape_interval_s
                while not self._stopping and time.monotonic() < deadline:
                    sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _poll_once(self) -> bool:
        """One pull from the sidecar; True when the page was full (more is waiting)."""
        assert self.client is not None
        try:
            wanted = self._wanted_step if self._wanted_step is not None else self.step_of()
            if self._sidecar_step != wanted:
                self.client.mark_step(wanted)
                self._sidecar_step = wanted
            page = self.client.samples_since(self._cursor if self._cursor is not None else 2**62, PAGE)
        except SamplerError as err:
            if self._sidecar_ok is not False:
                self._sidecar_ok = False
                self._event("sampler_gap", f"GPU sidecar samples stopped: {err}")
            return False
        if self._sidecar_ok is False:
            self._event("sampler_back", f"GPU sidecar at {self.url} answers again")
        self._sidecar_ok = True
        if self._boot_id is not None and page.boot_id != self._boot_id:
            self._boot_id, self._cursor, self._sidecar_step = page.boot_id, 0, None
            self._event(
                "warning", f"GPU sidecar at {self.url} restarted: its samples before the restart are lost"
            )
            return True  # mark the step again, then read the new sidecar from its first sample
        self._boot_id = page.boot_id
        if self._cursor is not None and page.dropped:
            self._event("warning", f"GPU sidecar dropped {page.dropped} samples before they were pulled")
        self._cursor = page.next_cursor
        for kind in ("gpu", "host", "server"):
            records = getattr(page, kind)
            if kind == "server" and self.server_reader is not None:
                continue  # scraped here already
            if kind == "gpu":
                records = self.server_gpus(records)
            if records:
                self._queues[kind].append(records)
                if kind == "gpu":
                    self._note_gpu(records)
        return len(page.samples) >= PAGE

    def deliver(self) -> None:
        """Hand everything queued to the callbacks, in the calling thread or greenlet."""
        flush_logs()
        for kind, queue in self._queues.items():
            callback = self._callbacks[kind]
            while queue:
                item = queue.popleft()
                try:
                    callback(item)
                except Exception as err:
                    if kind not in self._failed_callbacks:
                        self._failed_callbacks.add(kind)
                        log.warning("on_%s callback failed (logged once): %s", kind, err)

    def _start_deliverer(self) -> None:
        if gevent_patched():
            import gevent

            def greenlet_loop() -> None:
                while not self._stopping:
                    self.deliver()
                    gevent.sleep(self._deliver_interval_s)

            self._deliverer = gevent.spawn(greenlet_loop)
        else:
            wake = threading.Event()

            def thread_loop() -> None:
                while not self._stopping:
                    self.deliver()
                    wake.wait(self._deliver_interval_s)

            self._deliverer = threading.Thread(target=thread_loop, name="gpu-monitor-deliver", daemon=True)
            self._deliverer.start()

    def _stop_deliverer(self, timeout_s: float) -> None:
        if self._deliverer is not None:
            self._deliverer.join(timeout_s)
            self._deliverer = None
