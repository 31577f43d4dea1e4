"""Concurrent requests scored together: one model call for the reviews of every request that is waiting.

A model call on 8 reviews costs little more than on 1 (the matrix products
are wider, not more numerous), so a server that scores each request alone
spends most of its time on per-call overhead. :class:`Batcher` queues each
request's reviews; a worker takes the first request waiting, waits at most
``max_wait_s`` for more (while the model is busy, requests queue up anyway)
up to ``max_batch_size`` reviews, scores them in one call on the model's one
thread, and hands each request its own rows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Result = TypeVar("Result")


@dataclass
class _Job:
    reviews: list[str]
    future: asyncio.Future = field(repr=False)


class Batcher(Generic[Result]):
    """Score the reviews of concurrent requests together with ``score`` (a list of reviews -> one result each).

    ``score`` runs on ``executor`` (give every batcher of one model the same
    one-thread executor, so two model calls never compete for the cores).
    A request's reviews are never split across calls; a request that would
    take a batch past ``max_batch_size`` waits for the next call, unless it is
    the first, which always goes.
    """

    def __init__(
        self,
        score: Callable[[list[str]], list[Result]],
        executor: Executor,
        max_batch_size: int = 64,
        max_wait_s: float = 0.005,
    ) -> None:
        if max_batch_size < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch_size must be >= 1 and max_wait_s >= 0 (got {max_batch_size}, {max_wait_s})")
        self.score = score
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        # What /info reports: how many model calls, and how many reviews they scored.
        self.model_calls = 0
        self.reviews_scored = 0
        self.largest_batch = 0
        self._held_over: _Job | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, reviews: list[str]) -> list[Result]:
        """The results for ``reviews``, in order, once the call that holds them has run."""
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Job(list(reviews), future))
        return await future

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._worker = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        """Stop the worker; requests still queued get an error (the server stops only after answering its requests)."""
        if self._worker is None:
            return
        self._worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._worker
        waiting = [self._held_over] if self._held_over else []
        while not self.queue.empty():
            waiting.append(self.queue.get_nowait())
        for job in waiting:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the server is stopping"))

    async def _work(self) -> None:
        while True:
            jobs = await self._gather()
            reviews = [review for job in jobs for review in job.reviews]
            self.model_calls += 1
            self.reviews_scored += len(reviews)
            self.largest_batch = max(self.largest_batch, len(reviews))
            try:
                results = await asyncio.get_running_loop().run_in_executor(self.executor, self.score, reviews)
            except Exception as error:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(error)
                continue
            start = 0
            for job in jobs:
                # A client that hung up has its future cancelled: its rows are dropped.
                if not job.future.done():
                    job.future.set_result(results[start : start + len(job.reviews)])
                start += len(job.reviews)

    async def _gather(self) -> list[_Job]:
        """The jobs of one model call: the first waiting, then whatever comes within ``max_wait_s`` that fits."""
        first, self._held_over = self._held_over or await self.queue.get(), None
        jobs, count = [first], len(first.reviews)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while count < self.max_batch_size:
            try:
                # Jobs already queued are taken without waiting; the deadline bounds the wait for new ones.
                job = self.queue.get_nowait() if not self.queue.empty() else None
                if job is None:
                    job = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                break
            if count + len(job.reviews) > self.max_batch_size:
                self._held_over = job
                break
            jobs.append(job)
            count += len(job.reviews)
        return jobs
