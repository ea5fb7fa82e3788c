"""The engine's continuous batch (step 4 of simulator.model.pipeline's algorithm): who waits, who runs, and for
vllm the KV blocks they hold.

A request inside the pipeline is a `Job`. At each step start `admit` first gives every running vllm
sequence the blocks its next token needs, preempting the most recently admitted one when none are free
(recompute: its blocks and encoder memory freed, its tokens lost, back to the front of the queue), then
admits from the waiting queue (FIFO) while the batch has fewer than max_batch sequences and, for vllm,
free blocks cover the prompt plus one token (trtllm: plus its whole answer). A sequence of n tokens holds
ceil((prompt_tokens + n) / kv_block_size_tokens) blocks. Triton (a dynamic batcher, `_admit_batches`)
admits whole batches instead: a free instance takes up to max_batch waiting requests at once. The vision-encoder memory of the running images
(vllm, outside the KV pool) is counted here too: it is freed with the sequence.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from simulator.model.profiles import Profile
from simulator.model.work import Work


@dataclass(slots=True)
class Job:
    job_id: int
    work: Work
    arrival_ms: float
    stream: bool
    force_oom: bool
    stage: str = "new"  # new | gateway | cpu | engine | done
    in_gateway: bool = False
    engine_in_ms: float = 0.0
    admitted_ms: float | None = None
    first_token_ms: float | None = None
    tokens: int = 0
    emitted: int = 0
    blocks: int = 0
    holds_mib: float = 0.0
    encoder_mib: float = 0.0  # vllm: its image's encoder memory, held while it runs
    preemptions: int = 0
    slow_first_ms: float = 0.0  # unscaled; added once, to the step it joins (slow_first_requests)


class Batch:
    """The waiting queue and the running batch, by job id (`jobs`: the pipeline's jobs, shared)."""

    def __init__(self, profile: Profile, jobs: dict[int, Job]) -> None:
        self.profile = profile
        self._jobs = jobs
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.free_blocks = profile.num_gpu_blocks
        self.encoder_mib = 0.0  # vision-encoder memory of the images in the running batch (vllm)
        self.preemptions = 0
        self.executions = 0  # batches formed: Triton's nv_inference_exec_count
        self.inferences = 0  # requests in them: its nv_inference_count (counted with the batch, as Triton does)
        self._executing: list[set[int]] = []  # triton: the job ids of each instance's batch still running

    def blocks_for(self, job: Job, tokens: int) -> int:
        return math.ceil((job.work.prompt_tokens + tokens) / self.profile.kv_block_size_tokens)

    def admit(self, t: float) -> list[Job]:
        """The jobs joining the step that starts at `t` (running ones grown first, for vllm)."""
        if self.profile.server == "triton":
            return self._admit_batches(t)
        vllm = self.profile.kind == "vllm"
        joined: list[Job] = []
        if vllm:
            self._grow_running_blocks()
        while self.waiting and len(self.running) < self.profile.max_batch:
            job = self._jobs[self.waiting[0]]
            if vllm:  # trtllm (GUARANTEED_NO_EVICT): the whole answer's blocks, so it is never preempted
                need = self.blocks_for(job, job.work.output_tokens if self.profile.server == "trtllm" else 1)
                if need > self.free_blocks:
                    break
                self.free_blocks -= need
                job.blocks = need
            self.waiting.popleft()
            self.running.append(job.job_id)
            if job.admitted_ms is None:
                job.admitted_ms = t
            joined.append(job)
        if joined:
            self.executions += 1
            self.inferences += len(joined)
        return joined

    def _admit_batches(self, t: float) -> list[Job]:
        """Triton's dynamic batcher: an instance whose batch has all answered takes the next batch, up
        to max_batch (max_batch_size) of the waiting requests at once, once max_batch wait or the oldest
        has waited max_queue_delay_ms."""
        running = set(self.running)
        self._executing = [ids & running for ids in self._executing if ids & running]
        joined: list[Job] = []
        while self.waiting and len(self._executing) < self.profile.instances and self.batch_due_ms(t) is None:
            batch = [self._jobs[self.waiting.popleft()] for _ in range(min(self.profile.max_batch, len(self.waiting)))]
            for job in batch:
                self.running.append(job.job_id)
                if job.admitted_ms is None:
                    job.admitted_ms = t
            self._executing.append({job.job_id for job in batch})
            self.executions += 1
            self.inferences += len(batch)
            joined.extend(batch)
        return joined

    def batch_due_ms(self, t: float) -> float | None:
        """Triton: when the batch waiting for more requests goes anyway (its oldest request has waited
        max_queue_delay); None when it may go now (full, or waited long enough) or nothing waits."""
        p = self.profile
        if not self.waiting or len(self.waiting) >= p.max_batch or p.max_queue_delay_ms <= 0:
            return None
        due = self._jobs[self.waiting[0]].engine_in_ms + p.max_queue_delay_ms
        return due if due > t else None

    def _grow_running_blocks(self) -> None:
        """Each running sequence takes the blocks its next token needs; preempt the newest when short."""
        i = 0
        while i < len(self.running):
            job = self._jobs[self.running[i]]
            need = self.blocks_for(job, job.tokens + 1) - job.blocks
            while need > self.free_blocks and len(self.running) > i + 1:
                self._preempt(self._jobs[self.running.pop()])
            if need > self.free_blocks:  # it is the newest itself
                self.running.pop(i)
                self._preempt(job)
                continue
            self.free_blocks -= need
            job.blocks += need
            i += 1

    def _preempt(self, job: Job) -> None:
        self.release_encoder(job)
        self.free_blocks += job.blocks
        job.blocks = 0
        job.tokens = 0
        job.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(job.job_id)

    def hold_encoder(self, joined: list[Job], need_mib: float) -> None:
        """The images joining the step were encoded: each holds its encoder memory until its answer."""
        for job in joined:
            job.encoder_mib = job.work.encoder_mib
        self.encoder_mib += need_mib

    def release_encoder(self, job: Job) -> None:
        self.encoder_mib = max(0.0, self.encoder_mib - job.encoder_mib)
        job.encoder_mib = 0.0

    def release(self, job: Job) -> None:
        """A job answered: its blocks and encoder memory are free."""
        self.free_blocks += job.blocks
        self.release_encoder(job)

    def drop(self, job: Job) -> None:
        """A job that joined the step leaves it before running (it failed in the encoder)."""
        self.running.remove(job.job_id)
        self.free_blocks += job.blocks
        job.blocks = 0

    def clear(self) -> None:
        """The server crashed: nothing waits, runs or holds memory."""
        self.waiting.clear()
        self.running.clear()
        self.free_blocks = self.profile.num_gpu_blocks
        self.encoder_mib = 0.0
        self._executing.clear()
