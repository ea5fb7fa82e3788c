"""The simulated server as a discrete-event model: gateway -> CPU pool -> engine, in virtual milliseconds.

Pure: no clock, no I/O. The HTTP layer feeds it arrivals stamped with the wall clock and calls
`advance(now_ms)`, which processes every due event in time order and returns what happened (tokens,
answers, failures). `truth` drives the same model in virtual time with a closed-loop client, so the
ground truth and the server cannot disagree. Late wake-ups do not drift: events keep their virtual times.

Algorithm (parameters in `simulator.model.profiles` and `simulator.model.options`; every duration x time_scale):
1. Arrival. While the server restarts after an OOM: 503. With a gateway: enter if fewer than
   gateway_slots are inside, else wait in its queue (at most gateway_queue, else 503 + Retry-After;
   a wait over gateway_wait_s is a 503 too). A request leaves the gateway when it ends.
2. CPU pool (cpu_workers > 0): FIFO over cpu_workers workers, each job takes cpu_ms.
3. Engine entry. pytorch: the request takes increment_mib now; if that exceeds total - reserved, it fails
   like an OOM (500), and with restart_on_oom every request inside fails and the server is down for
   restart_s. vllm: memory is flat; the request joins the waiting queue.
4. Engine steps (continuous batching, simulator.model.batch). At each step start, admit from the waiting
   queue (FIFO) while the batch has fewer than max_batch sequences and, for vllm, free KV blocks cover the
   prompt plus one token. vllm: a running sequence whose next token crosses a block boundary takes a
   block; with none free the most recently admitted sequence is preempted (recompute: blocks freed,
   progress lost, back to the front of the queue). The step lasts max(a + b x batch, c x batch) (c: the
   compute roofline, 0 for most profiles) + the prefill of the sequences that joined; at its end every
   running sequence has one more token; those with output_tokens tokens are answered.
Settings (simulator.model.settings): max_num_seqs replaces max_batch; gpu_memory_utilization sizes the pool
and the KV cache. vllm profiles with encoder_mib_per_mpix: the images joining a step are encoded in it and
their memory stays outside the pool until their answers; when pool + the running images' + theirs exceed
the card, every image joining fails with a 500 OOM (and with restart_on_oom the server crashes). A step lasts step_host_ms (host work, the GPU idle)
+ its GPU part, the latter x the thermal slowdown (simulator.model.thermal); with stalls (stall_every_s) the
engine does no work inside [k x every, k x every + stall_s).
Habits (Options): the first request to reach the engine loads first_request_mib once, kept (allocator);
the first slow_first_requests requests to run make the step they join slow_first_s longer (a first compile
holds the engine); with latency_drift_pct_per_min every step's GPU part is x (1 + pct/100 x minutes since
the start). Load-independent errors (error_rate) are drawn before the pipeline, in the HTTP layer.
"""

from __future__ import annotations

import heapq
from collections import deque

from simulator.model.allocator import DeviceMemory
from simulator.model.batch import Batch, Job
from simulator.model.options import Options
from simulator.model.outcomes import Failed, Finished, Outcome, Snapshot, Tokens
from simulator.model.profiles import Profile
from simulator.model.settings import settle, stalled_end
from simulator.model.thermal import Thermal
from simulator.model.utilisation import BusyTime
from simulator.model.work import Work

__all__ = ["Failed", "Finished", "Outcome", "Pipeline", "Snapshot", "Tokens"]

ARRIVE, GW_TIMEOUT, CPU_DONE, STEP_END, RESTART_DONE, BATCH_DUE = range(6)


class Pipeline:
    def __init__(
        self,
        profile: Profile,
        options: Options,
        restart_on_oom: bool = False,
        restart_s: float = 5.0,
        start_temp_c: float | None = None,
    ):
        self.profile = profile = settle(profile, options)
        self.options = options
        self.restart_on_oom = restart_on_oom
        self.restart_s = restart_s
        self._scale = options.time_scale
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._jobs: dict[int, Job] = {}
        self._gw_inside = 0
        self._gw_queue: deque[int] = deque()
        self._cpu_busy = 0
        self._cpu_queue: deque[int] = deque()
        self._lock_queue: deque[int] = deque()  # hf: requests waiting for generate's lock, off the GPU
        self._batch = Batch(profile, self._jobs)
        self._step_serial = 0
        self._stepping = False
        self._held_mib = 0.0
        self.thermal = Thermal(options.heat, options.time_scale, start_temp_c)
        self._step_busy_share = 0.0
        self.memory = DeviceMemory(options.allocator, options.first_request_mib)  # the device's view
        self._slow_left = options.slow_first_requests
        self._leak_mib = 0.0
        self._down_until_ms: float | None = None
        self._busy = BusyTime()
        self._peak_mem_mib = 0.0  # the most device memory the model used (the truth's peak)
        self._out: list[Outcome] = []

    # ---- inputs -------------------------------------------------------------------------------
    def submit(
        self, job_id: int, work: Work, now_ms: float, stream: bool = False, force_oom: bool = False
    ) -> None:
        self._jobs[job_id] = Job(job_id, work, now_ms, stream, force_oom)
        self._push(now_ms, ARRIVE, job_id)

    def add_leak(self, mib: float) -> None:
        self._leak_mib += mib

    def next_due_ms(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def advance(self, now_ms: float) -> list[Outcome]:
        while self._heap and self._heap[0][0] <= now_ms:
            t, _, kind, ref = heapq.heappop(self._heap)
            self._handle(t, kind, ref)
        out, self._out = self._out, []
        return out

    def snapshot(self, now_ms: float) -> Snapshot:
        p = self.profile
        down = self.is_down(now_ms)
        if down:
            mem = 0.0
        elif p.kind == "vllm":
            mem = p.idle_mib + self._leak_mib + self.memory.loaded_once_mib + self.memory.device_mib(self._batch.encoder_mib)
        else:
            mem = p.idle_mib + self._leak_mib + self.memory.loaded_once_mib + self.memory.device_mib(self._held_mib)
        used_blocks = p.num_gpu_blocks - self._batch.free_blocks
        util = self._busy.util_pct(now_ms)
        return Snapshot(
            running=len(self._batch.running),
            waiting=len(self._batch.waiting) + len(self._gw_queue) + len(self._cpu_queue) + len(self._lock_queue),
            kv_usage=used_blocks / p.num_gpu_blocks if p.kind == "vllm" else 0.0,
            mem_used_mib=mem,
            gpu_util_pct=util,
            down=down,
            preemptions_total=self._batch.preemptions,
            heat=self.thermal.reading(now_ms, util / 100.0),  # power as NVML averages it: the last second
            executions_total=self._batch.executions,
            inferences_total=self._batch.inferences,
        )

    def take_framework_peak_mib(self) -> float:
        """MiB requests held at most since the previous call (the framework's view; see allocator)."""
        return self._leak_mib + self.memory.take_framework_peak_mib(self._held_mib)

    def is_down(self, now_ms: float) -> bool:
        return self._down_until_ms is not None and now_ms < self._down_until_ms

    # ---- events -------------------------------------------------------------------------------
    def _push(self, t_ms: float, kind: int, ref: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t_ms, self._seq, kind, ref))

    def _handle(self, t: float, kind: int, ref: int) -> None:
        if kind == STEP_END:
            if ref == self._step_serial and self._stepping:
                self._end_step(t)
            return
        if kind == RESTART_DONE:
            self._down_until_ms = None
            return
        if kind == BATCH_DUE:  # triton: a batch that waited max_queue_delay for more requests goes
            if not self._stepping:
                self._start_step(t)
            return
        job = self._jobs.get(ref)
        if job is None:
            return
        if kind == ARRIVE:
            self._arrive(job, t)
        elif kind == GW_TIMEOUT and job.stage == "gateway":
            self._gw_queue.remove(job.job_id)
            self._fail(job, t, 503, "gateway_timeout", "gateway queue wait timed out", self.options.retry_after_s)
        elif kind == CPU_DONE and job.stage == "cpu":
            self._cpu_busy -= 1
            self._start_next_cpu(t)
            self._enter_engine(job, t)

    def _arrive(self, job: Job, t: float) -> None:
        if self.is_down(t):
            self._fail(job, t, 503, "restarting", "server is restarting after an out-of-memory crash", self.options.retry_after_s)
            return
        o = self.options
        if o.gateway_slots <= 0:
            self._enter_cpu(job, t)
        elif self._gw_inside < o.gateway_slots:
            self._gw_inside += 1
            job.in_gateway = True
            self._enter_cpu(job, t)
        elif len(self._gw_queue) < o.gateway_queue:
            job.stage = "gateway"
            self._gw_queue.append(job.job_id)
            self._push(t + o.gateway_wait_s * 1000.0 * self._scale, GW_TIMEOUT, job.job_id)
        else:
            self._fail(job, t, 503, "gateway_full", "gateway queue is full", self.options.retry_after_s)

    def _release_gateway(self, job: Job, t: float) -> None:
        if not job.in_gateway:
            return
        job.in_gateway = False
        self._gw_inside -= 1
        if self._gw_queue:
            nxt = self._jobs[self._gw_queue.popleft()]
            self._gw_inside += 1
            nxt.in_gateway = True
            self._enter_cpu(nxt, t)

    def _enter_cpu(self, job: Job, t: float) -> None:
        if self.options.cpu_workers <= 0:
            self._enter_engine(job, t)
            return
        job.stage = "cpu"
        if self._cpu_busy < self.options.cpu_workers:
            self._cpu_busy += 1
            self._push(t + job.work.cpu_ms * self._scale, CPU_DONE, job.job_id)
        else:
            job.stage = "cpu_queue"
            self._cpu_queue.append(job.job_id)

    def _start_next_cpu(self, t: float) -> None:
        if self._cpu_queue:
            job = self._jobs[self._cpu_queue.popleft()]
            job.stage = "cpu"
            self._cpu_busy += 1
            self._push(t + job.work.cpu_ms * self._scale, CPU_DONE, job.job_id)

    def _enter_engine(self, job: Job, t: float) -> None:
        p = self.profile
        # generate's lock (hf), Triton's queue: wait before the GPU, holding no GPU memory
        if p.server in ("hf", "triton") and self._in_engine() >= p.engine_slots:
            job.stage = "lock"
            self._lock_queue.append(job.job_id)
            return
        self.memory.note_request()
        if p.kind == "pytorch" or job.force_oom:
            used = p.idle_mib + self._leak_mib + self.memory.loaded_once_mib + self._held_mib
            need = job.work.increment_mib
            if job.force_oom or used + need > p.total_mib - p.reserved_mib:
                free = max(0.0, p.total_mib - p.reserved_mib - used)
                gpu = 1 if self.options.other_card_mib > 0 else 0
                msg = (
                    f"CUDA out of memory. Tried to allocate {need:.0f} MiB "
                    f"(GPU {gpu}; {p.total_mib:.0f} MiB total capacity; {free:.0f} MiB free)"
                )
                self._fail(job, t, 500, "oom", msg, None)
                if self.restart_on_oom:
                    self._crash(t)
                self._unlock(t)
                return
            job.holds_mib = need
            self._held_mib += need
            self.memory.note_held(self._held_mib)
            self._note_peak(used + need)
        elif self._batch.blocks_for(job, job.work.output_tokens) > p.num_gpu_blocks:
            n = job.work.prompt_tokens + job.work.output_tokens
            msg = f"request needs {n} tokens, more than the KV cache holds ({p.kv_cache_size_tokens}): resize the image"
            self._fail(job, t, 400, "too_long", msg, None)
            return
        if self._slow_left > 0:
            self._slow_left -= 1
            job.slow_first_ms = self.options.slow_first_s * 1000.0
        job.stage = "engine"
        job.engine_in_ms = t
        self._batch.waiting.append(job.job_id)
        if not self._stepping:
            self._start_step(t)

    def _in_engine(self) -> int:
        return len(self._batch.running) + len(self._batch.waiting)

    def _unlock(self, t: float) -> None:
        """HF generate: the request that waited longest before the GPU enters as one leaves."""
        while self._lock_queue and self._in_engine() < self.profile.engine_slots:
            self._enter_engine(self._jobs[self._lock_queue.popleft()], t)

    def _crash(self, t: float) -> None:
        victims = [job for job in self._jobs.values() if job.stage != "new"]
        for job in victims:
            job.in_gateway = False  # the gateway empties with the server: no hand-over
            self._fail(job, t, 503, "restarting", "server crashed after an out-of-memory error", self.options.retry_after_s)
        self._gw_queue.clear()
        self._cpu_queue.clear()
        self._lock_queue.clear()
        self._batch.clear()
        self._cpu_busy = 0
        self._gw_inside = 0
        self._stepping = False
        self._step_serial += 1
        self._held_mib = 0.0
        self.memory.release_all()
        self._leak_mib = 0.0
        self._down_until_ms = t + self.restart_s * 1000.0 * self._scale
        self._push(self._down_until_ms, RESTART_DONE, 0)

    # ---- engine -------------------------------------------------------------------------------
    def _start_step(self, t: float) -> None:
        p = self.profile
        self.thermal.advance(t, 0.0)  # since the last step ended the GPU idled
        joined = self._batch.admit(t)
        if joined and not self._encode(joined, t):
            return
        joined = [job for job in joined if job.stage == "engine"]  # those that failed in the encoder cost nothing
        if not self._batch.running:
            self._stepping = False
            due = self._batch.batch_due_ms(t)
            if due is not None:
                self._push(due, BATCH_DUE, 0)
            return
        n = len(self._batch.running)
        decode_ms = max(p.step_base_ms + p.step_per_seq_ms * n, p.step_compute_ms_per_seq * n)
        gpu_ms = (decode_ms + sum(j.work.prefill_ms for j in joined)) * self.thermal.slowdown() * self._drift(t)
        host_ms = p.step_host_ms + sum(j.slow_first_ms for j in joined) + p.step_ms_per_waiting * len(self._batch.waiting)
        for job in joined:
            job.slow_first_ms = 0.0  # once: a preempted sequence that rejoins is already compiled
        o = self.options
        every, stall = o.stall_every_s * 1000.0 * self._scale, o.stall_s * 1000.0 * self._scale
        busy_from = stalled_end(t, host_ms * self._scale, every, stall)
        end = stalled_end(busy_from, gpu_ms * self._scale, every, stall)
        self._stepping = True
        self._step_serial += 1
        self._step_busy_share = gpu_ms * self._scale / (end - t) if end > t else 0.0
        self._push(end, STEP_END, self._step_serial)
        self._busy.note(busy_from, end)

    def _drift(self, t: float) -> float:
        """latency_drift_pct_per_min: the slowdown of a step starting t ms after the server started."""
        return 1.0 + self.options.latency_drift_pct_per_min / 100.0 * t / 60_000.0

    def _encode(self, joined: list[Job], t: float) -> bool:
        """The vision encoder runs on the images joining this step; each one's memory (activations, its
        embeddings) stays outside the pool while it runs. When the running images' and theirs do not fit,
        every image of the step fails with an OOM. False when the server crashed with them."""
        p = self.profile
        need = sum(j.work.encoder_mib for j in joined)
        if need <= 0:
            return True
        used = p.idle_mib + self._leak_mib + self.memory.loaded_once_mib + self._batch.encoder_mib
        if used + need <= p.total_mib - p.reserved_mib:
            self._batch.hold_encoder(joined, need)
            self.memory.note_held(self._batch.encoder_mib)
            self._note_peak(used + need)
            return True
        free = max(0.0, p.total_mib - p.reserved_mib - used)
        gpu = 1 if self.options.other_card_mib > 0 else 0
        msg = (
            f"CUDA out of memory. Tried to allocate {need:.0f} MiB in the vision encoder for {len(joined)} images"
            f" (GPU {gpu}; {p.total_mib:.0f} MiB total capacity; {free:.0f} MiB free)"
        )
        for job in joined:
            self._batch.drop(job)
            self._fail(job, t, 500, "oom", msg, None)
        if self.restart_on_oom:
            self._crash(t)
            return False
        return True

    def _note_peak(self, used_mib: float) -> None:
        self._peak_mem_mib = max(self._peak_mem_mib, used_mib)

    @property
    def busy_total_ms(self) -> float:
        return self._busy.total_ms

    @property
    def peak_mem_mib(self) -> float:
        return self._peak_mem_mib

    def _end_step(self, t: float) -> None:
        self.thermal.advance(t, self._step_busy_share)
        still: list[int] = []
        for job_id in self._batch.running:
            job = self._jobs[job_id]
            job.tokens += 1
            if job.first_token_ms is None:
                job.first_token_ms = t
            if job.tokens > job.emitted:
                if job.stream:
                    self._out.append(Tokens(job_id, t, job.emitted, job.tokens - job.emitted))
                job.emitted = job.tokens
            if job.tokens >= job.work.output_tokens:
                self._finish(job, t)
            else:
                still.append(job_id)
        self._batch.running = still
        self._unlock(t)
        self._start_step(t)

    def _finish(self, job: Job, t: float) -> None:
        self._batch.release(job)
        self._held_mib -= job.holds_mib
        job.stage = "done"
        first = job.first_token_ms if job.first_token_ms is not None else t
        admitted = job.admitted_ms if job.admitted_ms is not None else t
        self._out.append(
            Finished(
                job_id=job.job_id,
                t_ms=t,
                prompt_tokens=job.work.prompt_tokens,
                output_tokens=job.work.output_tokens,
                e2e_ms=t - job.arrival_ms,
                ttft_ms=first - job.arrival_ms,
                queue_ms=admitted - job.engine_in_ms,
                preemptions=job.preemptions,
                admitted_ms=admitted,
                runaway=job.work.runaway,
            )
        )
        del self._jobs[job.job_id]
        self._release_gateway(job, t)

    def _fail(
        self, job: Job, t: float, status: int, kind: str, message: str, retry_after_s: int | None
    ) -> None:
        job.stage = "done"
        self._out.append(Failed(job.job_id, t, status, kind, message, retry_after_s))
        self._jobs.pop(job.job_id, None)
        self._release_gateway(job, t)
