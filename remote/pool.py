"""Work spread over several servers: bounded in flight per server, failed jobs retried elsewhere.

`ServerPool(urls, per_server=2).run(jobs, call)` calls `call(client, job)` for every job, with at
most `per_server` calls in flight on each server (a `dgchat serve` generates one request at a time
and queues the next, so 2 keeps it busy without piling work on one server while another idles).
Results come back in the jobs' order whatever server answered first, so the output of a run does
not depend on timing.

When a call fails with an error another server may not have (no connection, a connection that
broke mid-answer, a timeout, 429, 5xx, an answer that is invalid or over its bounds) the job goes
back to the front of the queue, marked to avoid that server while another is alive, and the server
waits 0.5, 1, 2, ... s before it takes more work; after `max_failures` failures in a row a server
is dropped for the rest of the run. An error that is final for the request (a 4xx: a bad request,
a rejected key) is the same while a server that has not tried the job is alive (a bad server is an
error for that server only), and stops the run when none is left to try it: then every server
would give it. If every server is dropped the run fails with each server's last error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dgchat.model_backend.errors import GenerationCancelled, InvalidParameterError
from dgchat.remote.client import DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEADLINE, DEFAULT_TIMEOUT, RemoteClient
from dgchat.remote.errors import RemoteError

J = TypeVar("J")
R = TypeVar("R")


@dataclass
class ServerStats:
    url: str
    jobs: int = 0  # jobs this server finished
    units: int = 0  # what the caller counts (lines) in the jobs it finished
    busy_s: float = 0.0  # wall time with at least one of its calls in flight
    failures: int = 0  # failed calls (their jobs were retried)
    dropped: str | None = None  # why it was dropped, if it was
    last_error: str | None = None

    @property
    def units_per_s(self) -> float:
        return self.units / self.busy_s if self.busy_s > 0 else 0.0


@dataclass
class _Pending(Generic[J]):
    index: int
    job: J
    avoid: set[str] = field(default_factory=set)


@dataclass
class PoolEvent:
    """What a progress display needs after each call: which job, where, and how it went."""

    kind: str  # "done" | "retry" | "dropped"
    index: int | None
    server: str
    result: Any = None
    error: str | None = None


class ServerPool:
    def __init__(self, urls: Sequence[str], *, api_key: str | None = None, per_server: int = 2,
                 timeout: float = DEFAULT_TIMEOUT, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 max_failures: int = 3, backoff: float = 0.5, max_backoff: float = 8.0,
                 deadline: float = DEFAULT_DEADLINE, sleep: Callable[[float], None] = time.sleep) -> None:
        if not urls:
            raise InvalidParameterError("give at least one --server")
        if per_server < 1:
            raise InvalidParameterError(f"--per-server must be >= 1 (got {per_server})")
        # the pool does its own retrying (elsewhere first), so each client tries a call once
        self.clients: list[RemoteClient] = []
        try:
            for u in urls:
                self.clients.append(RemoteClient(u, api_key=api_key, timeout=timeout, connect_timeout=connect_timeout,
                                                 retries=0, deadline=deadline))
        except BaseException:
            self.close()
            raise
        seen = set()
        for c in self.clients:
            if c.url in seen:
                self.close()
                raise InvalidParameterError(f"--server {c.url} is given twice")
            seen.add(c.url)
        self.per_server = per_server
        self.max_failures = max(1, max_failures)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        self.stats = {c.url: ServerStats(c.url) for c in self.clients}

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def drop(self, url: str, reason: str) -> None:
        """Take a server out of the pool before a run (check_servers found it unusable)."""
        self.stats[url].dropped = reason
        self.stats[url].last_error = reason

    def live_clients(self) -> list[RemoteClient]:
        return [c for c in self.clients if not self.stats[c.url].dropped]

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, jobs: Sequence[J], call: Callable[[RemoteClient, J], R], *,
            units: Callable[[R], int] = lambda r: 1, on_event: Callable[[PoolEvent], None] | None = None,
            cancel: threading.Event | None = None) -> list[R]:
        """Every job's result, in the jobs' order (see the module docstring)."""
        pending: list[_Pending[J]] = [_Pending(i, j) for i, j in enumerate(jobs)]
        results: dict[int, R] = {}
        cond = threading.Condition()
        live = self.live_clients()
        alive = {c.url for c in live}
        in_flight: dict[str, int] = {c.url: 0 for c in self.clients}
        busy_since: dict[str, float] = {}
        streak = {c.url: 0 for c in self.clients}  # failures in a row, per server (all its workers)
        fatal: list[BaseException] = []
        total = len(pending)

        def report(event: PoolEvent) -> None:
            if on_event is not None:
                on_event(event)

        def take(url: str) -> _Pending[J] | None:
            """The first job this server should do; waits while there is none for it (yet)."""
            with cond:
                while True:
                    if fatal or len(results) == total or url not in alive or (cancel is not None and cancel.is_set()):
                        return None
                    for k, item in enumerate(pending):
                        # a job that failed here goes elsewhere while a server it has not failed on lives
                        if url not in item.avoid or not (alive - item.avoid):
                            del pending[k]
                            if in_flight[url] == 0:
                                busy_since[url] = time.perf_counter()
                            in_flight[url] += 1
                            return item
                    cond.wait(0.1)

        def settle(url: str) -> None:
            in_flight[url] -= 1
            if in_flight[url] == 0:
                self.stats[url].busy_s += time.perf_counter() - busy_since.pop(url)

        def worker(client: RemoteClient) -> None:
            url = client.url
            stats = self.stats[url]
            while True:
                item = take(url)
                if item is None:
                    return
                try:
                    result = call(client, item.job)
                except RemoteError as exc:
                    with cond:
                        settle(url)
                        # final for the request: another server may still take it if it has not tried
                        if not exc.retryable and not (alive - item.avoid - {url}):
                            fatal.append(exc)
                            cond.notify_all()
                            return
                        stats.failures += 1
                        stats.last_error = str(exc)
                        streak[url] += 1
                        failures = streak[url]
                        item.avoid.add(url)
                        pending.insert(0, item)
                        pending.sort(key=lambda p: p.index)
                        dropped = failures >= self.max_failures and url in alive
                        if dropped:
                            alive.discard(url)
                            stats.dropped = str(exc)
                        cond.notify_all()
                    report(PoolEvent("dropped" if dropped else "retry", item.index, url, error=str(exc)))
                    if dropped:
                        return
                    self._sleep(min(self.backoff * 2 ** (failures - 1), self.max_backoff))
                    continue
                except BaseException as exc:  # noqa: BLE001 - a bug or Ctrl-C: stop the run, report it
                    with cond:
                        settle(url)
                        fatal.append(exc)
                        cond.notify_all()
                    return
                with cond:
                    streak[url] = 0
                    settle(url)
                    results[item.index] = result
                    stats.jobs += 1
                    stats.units += units(result)
                    cond.notify_all()
                report(PoolEvent("done", item.index, url, result=result))

        threads = [threading.Thread(target=worker, args=(c,), name=f"dgchat-pool-{n}", daemon=True)
                   for c in live for n in range(self.per_server)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
        if fatal:
            raise fatal[0]
        if cancel is not None and cancel.is_set() and len(results) < total:
            raise GenerationCancelled("stopped before every job was done")
        if len(results) < total:
            reasons = "; ".join(f"{s.url}: {s.dropped or s.last_error or 'dropped'}" for s in self.stats.values())
            raise RemoteError(f"every server failed; {total - len(results)} of {total} jobs were not done ({reasons})")
        return [results[i] for i in range(total)]
