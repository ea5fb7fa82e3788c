"""The HTTP layer: aiohttp apps for the OCR endpoints and the DCGM exporter, driving a `Pipeline` in wall time.

The pipeline's virtual milliseconds are the event loop's clock since start (`loop.time()`); a timer is
armed at the next due event, so engine steps land within about a millisecond of their model time.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from dataclasses import asdict, dataclass, field
from http import HTTPStatus

from aiohttp import web

from simulator.exports.metrics import (
    ServerStats,
    render_dcgm_metrics,
    render_framework_metric,
    render_vllm_metrics,
)
from simulator.exports.requestlog import RESET_KEY, START_KEY, RequestLog, timing_middleware
from simulator.exports.triton_metrics import render_triton_metrics
from simulator.exports.trtllm_metrics import iteration_stats, render_trtllm_metrics
from simulator.front.bodies import read_json, read_ocr_body
from simulator.front.chat_stream import stream_chat
from simulator.front.images import BadInput, ImageInput, chat_request_from_json, inspect_image
from simulator.front.oip import HEADER_LENGTH, image_of_infer, infer_answer, model_config, model_metadata
from simulator.front.replies import (
    Reset,
    bearer_refused,
    error,
    failed_response,
    json_errors,
    reset_connection,
    usage_of,
)
from simulator.front.waiter import Waiter, new_waiter
from simulator.model.faults import Decision, FaultError, FaultPlan, Faults, starting_faults, updated_faults
from simulator.model.options import Options
from simulator.model.pipeline import Failed, Finished, Outcome, Pipeline, Tokens
from simulator.model.profiles import Profile
from simulator.model.settings import settle
from simulator.truth import truth

MIB = 1024 * 1024
LOOPBACK = {"127.0.0.1", "::1"}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    profile: Profile
    options: Options = field(default_factory=Options)
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    max_body_mib: float = 64.0
    max_pixels: int = 50_000_000
    hostname: str = "simulator"
    metrics_token: str = field(default="", repr=False)  # set: /metrics and the DCGM page want this bearer
    request_log: str = ""  # a CSV path: one line per OCR request with the server's own times (requestlog)


class SimServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.profile = settle(config.profile, config.options)  # --max-num-seqs, --gpu-memory-utilization
        self.pipeline = Pipeline(
            config.profile, config.options, config.faults.restart_on_oom, config.faults.restart_s
        )
        self.plan = FaultPlan(starting_faults(config.faults, config.options), config.seed)
        self._lengths = random.Random(f"answer-lengths-{config.seed}")  # apart from the faults' draws
        self._runaways = random.Random(f"runaways-{config.seed}")
        self._log = RequestLog(config.request_log) if config.request_log else None
        self._unix_t0 = 0.0
        self.stats = ServerStats()
        self._waiters: dict[int, Waiter] = {}
        self._next_id = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._unavailable_until_ms = config.faults.slow_start_s * 1000.0 * config.options.time_scale
        self._runners: list[web.AppRunner] = []

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(
        self, host: str, port: int, dcgm_port: int | None, tls: ssl.SSLContext | None = None
    ) -> tuple[int, int | None]:
        """Listen (HTTPS on both with a `tls` server context); returns the bound (port, dcgm_port).
        dcgm_port None: no DCGM exporter."""
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._unix_t0 = time.time()
        bound = await self._listen(self.ocr_app(), host, port, tls)
        dcgm_bound = None if dcgm_port is None else await self._listen(self.dcgm_app(), host, dcgm_port, tls)
        return bound, dcgm_bound

    async def _listen(self, app: web.Application, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port, ssl_context=tls).start()
        return int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._log is not None:
            self._log.close()
            self._log = None

    def now_ms(self) -> float:
        assert self._loop is not None, "start() the server first"
        return (self._loop.time() - self._t0) * 1000.0

    # ---- the pipeline in wall time ------------------------------------------------------------
    def _tick(self) -> None:
        self._timer = None
        for outcome in self.pipeline.advance(self.now_ms()):
            self._deliver(outcome)
        due = self.pipeline.next_due_ms()
        if due is not None and self._loop is not None:
            self._timer = self._loop.call_at(self._t0 + due / 1000.0, self._tick)

    def _submit(self, image: ImageInput, max_tokens: int | None, stream: bool, decision: Decision) -> Waiter:
        assert self._loop is not None
        waiter = new_waiter(
            self._loop, profile=self.profile, options=self.config.options, image=image, max_tokens=max_tokens,
            stream=stream, lengths=self._lengths, runaways=self._runaways,
        )  # fmt: skip
        job_id = self._next_id
        self._next_id += 1
        self._waiters[job_id] = waiter
        self.pipeline.submit(job_id, waiter.work, self.now_ms(), stream=stream, force_oom=decision.force_oom)
        if self._timer is not None:
            self._timer.cancel()
        self._tick()
        return waiter

    def _deliver(self, outcome: Outcome) -> None:
        waiter = self._waiters.get(outcome.job_id)
        if waiter is None:
            return
        if waiter.tokens is not None:
            waiter.tokens.put_nowait(outcome)
        if isinstance(outcome, Tokens):
            return
        del self._waiters[outcome.job_id]
        if isinstance(outcome, Finished):
            s = self.stats
            s.success["length" if waiter.truncated else "stop"] += 1
            s.prompt_tokens += outcome.prompt_tokens
            s.generation_tokens += outcome.output_tokens
            s.e2e.observe(outcome.e2e_ms / 1000.0)
            s.ttft.observe(outcome.ttft_ms / 1000.0)
            s.queue.observe(outcome.queue_ms / 1000.0)
            self.pipeline.add_leak(self.plan.faults.leak_mib_per_request)
        if not waiter.future.done():
            waiter.future.set_result(outcome)

    # ---- apps ---------------------------------------------------------------------------------
    def ocr_app(self) -> web.Application:
        app = web.Application(
            middlewares=[timing_middleware(self._log), json_errors], client_max_size=int(self.config.max_body_mib * MIB)
        )
        app.router.add_post("/ocr", self._ocr)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v2/models/{model}/infer", self._infer)
        app.router.add_get("/v2/health/ready", self._v2_ready)
        app.router.add_get("/v2/health/live", self._v2_ready)
        app.router.add_get("/v2/models/{model}", self._v2_model)
        app.router.add_get("/v2/models/{model}/ready", self._v2_model)
        app.router.add_get("/v2/models/{model}/config", self._v2_model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/prometheus/metrics", self._prometheus)
        app.router.add_get("/truth", self._truth)
        app.router.add_get("/admin/faults", self._faults)
        app.router.add_post("/admin/faults", self._faults)
        return app

    def dcgm_app(self) -> web.Application:
        app = web.Application(middlewares=[json_errors])
        app.router.add_get("/metrics", self._dcgm)
        return app

    # ---- handlers -----------------------------------------------------------------------------
    def _unavailable(self) -> bool:
        now = self.now_ms()
        return now < self._unavailable_until_ms or self.pipeline.is_down(now)

    def _gate(self, request: web.Request) -> Decision:
        """Slow start, then this request's draw of the faults; raises what the fault answers."""
        if self._unavailable():
            raise error(503, "server is starting or restarting", retry_after_s=self.config.options.retry_after_s)
        decision = self.plan.draw()
        if decision.reset:
            request[RESET_KEY] = True
            reset_connection(request)
            raise Reset()
        if decision.error:  # at every load, before any work: a balancer dropping a share of requests
            status = self.plan.faults.error_status
            raise error(status, f"injected error: {status} {_phrase(status)}")
        return decision

    async def _ocr(self, request: web.Request) -> web.StreamResponse:
        decision = self._gate(request)
        data, max_tokens = await read_ocr_body(request)
        waiter = self._submit(inspect_image(data, self.config.max_pixels), max_tokens, False, decision)
        outcome = await waiter.future
        await self._finish(request, outcome, decision)
        if isinstance(outcome, Failed):
            return failed_response(outcome)
        return web.json_response(
            {
                **waiter.ocr,
                "model": self.profile.model_name,
                "finish_reason": "length" if waiter.truncated else "stop",
                "usage": usage_of(outcome),
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        decision = self._gate(request)
        chat = chat_request_from_json(await read_json(request))
        waiter = self._submit(
            inspect_image(chat.image, self.config.max_pixels), chat.max_tokens, chat.stream, decision
        )
        created = int(time.time())
        base = {"id": f"chatcmpl-sim-{id(waiter):x}", "created": created, "model": self.profile.model_name}
        reason = "length" if waiter.truncated else "stop"
        if not chat.stream:
            outcome = await waiter.future
            await self._finish(request, outcome, decision)
            if isinstance(outcome, Failed):
                return failed_response(outcome)
            message = {"role": "assistant", "content": waiter.text}
            choice = {"index": 0, "message": message, "finish_reason": reason}
            return web.json_response(
                {**base, "object": "chat.completion", "choices": [choice], "usage": usage_of(outcome)}
            )
        try:
            return await stream_chat(
                request, waiter, base, reason, lambda done: self._finish(request, done, decision)
            )
        except ConnectionResetError:  # the client left mid-stream; the engine already did the work
            return web.Response(status=499)

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        """The Open Inference Protocol's infer (simulator.front.oip): one page in, its text as output TEXT."""
        self._known_model(request)
        decision = self._gate(request)
        data = image_of_infer(await request.read(), request.headers.get(HEADER_LENGTH))
        waiter = self._submit(inspect_image(data, self.config.max_pixels), None, False, decision)
        outcome = await waiter.future
        await self._finish(request, outcome, decision)
        if isinstance(outcome, Failed):
            return failed_response(outcome)
        return web.json_response(infer_answer(self.profile, waiter.text))

    def _known_model(self, request: web.Request) -> None:
        name = request.match_info["model"]
        if name != self.profile.model_name:
            raise BadInput(404, f"Request for unknown model: '{name}' is not found")

    async def _v2_ready(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=503 if self._unavailable() else 200)

    async def _v2_model(self, request: web.Request) -> web.StreamResponse:
        """GET /v2/models/{name}[/ready|/config]: its metadata, its readiness, Triton's model config."""
        self._known_model(request)
        if request.path.endswith("/ready"):
            return web.Response(status=503 if self._unavailable() else 200)
        if request.path.endswith("/config"):
            return web.json_response(model_config(self.profile))
        return web.json_response(model_metadata(self.profile))

    async def _finish(self, request: web.Request, outcome: Finished | Failed, decision: Decision) -> None:
        """The engine is done: note its start of work for the request log (Unix s), then the drawn spike."""
        if isinstance(outcome, Finished):
            request[START_KEY] = self._unix_t0 + outcome.admitted_ms / 1000.0
        await self._spike(decision)

    async def _spike(self, decision: Decision) -> None:
        if decision.spike_ms > 0:
            await asyncio.sleep(decision.spike_ms * self.config.options.time_scale / 1000.0)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        if self._unavailable():
            retry = str(self.config.options.retry_after_s)
            return web.json_response({"status": "unavailable"}, status=503, headers={"Retry-After": retry})
        return web.json_response(
            {"status": "ok", "profile": self.profile.name, "model": self.profile.model_name}
        )

    def _metrics_refused(self, request: web.Request) -> web.StreamResponse | None:
        return bearer_refused(self.config.metrics_token, request)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if refused := self._metrics_refused(request):
            return refused
        snap = self.pipeline.snapshot(self.now_ms())
        if self.profile.server == "trtllm":  # trtllm-serve: JSON iteration stats here, Prometheus elsewhere
            return web.json_response(iteration_stats(self.profile, snap, time.time()))
        if self.profile.server == "vllm":
            text = render_vllm_metrics(self.profile, snap, self.stats)
        elif self.profile.server == "triton":  # Triton's nv_* (its port 8002's /metrics)
            text = render_triton_metrics(self.profile, snap, self.stats)
        else:  # a PyTorch server (FastAPI, HF generate): no vllm:* series, the framework's view only
            text = render_framework_metric(self.profile, self.pipeline.take_framework_peak_mib())
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _prometheus(self, request: web.Request) -> web.StreamResponse:
        """trtllm-serve's Prometheus page (simulator.exports.trtllm_metrics); 404 for other backends, as theirs."""
        if self.profile.server != "trtllm":
            raise web.HTTPNotFound()
        if refused := self._metrics_refused(request):
            return refused
        text = render_trtllm_metrics(self.profile, self.pipeline.snapshot(self.now_ms()), self.stats)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _dcgm(self, request: web.Request) -> web.StreamResponse:
        if refused := self._metrics_refused(request):
            return refused
        snap = self.pipeline.snapshot(self.now_ms())
        text = render_dcgm_metrics(self.profile, snap, self.config.hostname, self.config.options)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _truth(self, request: web.Request) -> web.StreamResponse:
        try:
            width = int(request.query["width"])
            height = int(request.query["height"])
            max_tokens = int(request.query["max_tokens"]) if "max_tokens" in request.query else None
        except (KeyError, ValueError):
            raise BadInput(400, "use /truth?width=<px>&height=<px>[&max_tokens=<n>]") from None
        if width < 1 or height < 1:
            raise BadInput(400, "width and height must be positive")
        options = asdict(self.config.options)
        assert self._loop is not None
        try:
            result = await self._loop.run_in_executor(
                None,
                lambda: truth(self.profile.name, width, height, max_tokens=max_tokens,
                              leak_mib_per_request=self.plan.faults.leak_mib_per_request, **options),
            )  # fmt: skip
        except ValueError as exc:
            raise BadInput(400, str(exc)) from None
        return web.json_response(asdict(result))

    async def _faults(self, request: web.Request) -> web.StreamResponse:
        if request.remote not in LOOPBACK:
            raise error(403, "the admin route answers loopback clients only")
        if request.method == "POST":
            changes = await read_json(request)
            try:
                faults = updated_faults(self.plan.faults, changes)
            except FaultError as exc:
                raise BadInput(400, str(exc)) from None
            self.plan.set(faults)
            self.pipeline.restart_on_oom = faults.restart_on_oom
            self.pipeline.restart_s = faults.restart_s
            if "slow_start_s" in changes:
                self._unavailable_until_ms = (
                    self.now_ms() + faults.slow_start_s * 1000.0 * self.config.options.time_scale
                )
        return web.json_response(self.plan.faults.to_json())


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"
