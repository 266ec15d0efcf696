"""Calls to nodes that may rightly take long (a scrub), each waited for while its node beats (decision 0024).

A node's heartbeats come from their own thread, so a node busy with the call still beats; a frozen one stops.
Each call runs in a daemon thread of its own, so a call left behind never holds the process at exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
N = TypeVar("N")

POLL_SECONDS = 0.2
"""How often the nodes still answering are looked up among the live."""
AT_ONCE = 32
"""Calls waited for at once; the next node's starts as one answers or is left (4,000 nodes are not 4,000 threads)."""


class Answer(Generic[T]):
    """One node's outcome: its call's value, or why there is none (the call failed, or the node stopped beating)."""

    __slots__ = ("value", "why", "done")

    def __init__(self) -> None:
        self.value: T | None = None
        self.why: str | None = None
        self.done = threading.Event()


def call_while_alive(nodes: Sequence[N], call: Callable[[N], T], node_id: Callable[[N], str],
                     alive: Callable[[], Collection[str]], stopping: threading.Event,
                     what: str = "call") -> list[Answer[T]]:
    """``call(node)`` for every node, :data:`AT_ONCE` at a time, each waited for while ``alive()`` (the ids of the
    nodes beating now) names its node; an answer without a value says why."""
    answers: list[Answer[T]] = [Answer() for _ in nodes]

    def run(node: N, answer: Answer[T]) -> None:
        try:
            answer.value = call(node)
        except Exception as exc:  # any failure is this node's answer; the others go on
            answer.why = f"did not answer ({exc})"
        finally:
            answer.done.set()

    queued = list(zip(nodes, answers))
    waiting: list[tuple[N, Answer[T]]] = []
    while queued or waiting:
        while queued and len(waiting) < AT_ONCE:
            node, answer = queued.pop(0)
            threading.Thread(target=run, args=(node, answer), name=f"flightpart-{what}", daemon=True).start()
            waiting.append((node, answer))
        waiting[0][1].done.wait(POLL_SECONDS)
        waiting = [(n, a) for n, a in waiting if not a.done.is_set()]
        if stopping.is_set():
            for _node, answer in waiting + queued:
                answer.why = "not waited for: the catalog is stopping"
            break
        if not waiting:
            continue
        beating = set(alive())
        for node, answer in waiting:
            if node_id(node) not in beating:
                answer.why = "stopped beating during the call (frozen or gone); left"
        waiting = [(n, a) for n, a in waiting if a.why is None]
    return answers
