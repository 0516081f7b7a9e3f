"""Run an iterator a few items ahead of its consumer, in a thread: the producer's work
(reading and decoding the next batch's audio: file reads, codecs and resampling release
the GIL) overlaps the consumer's (the model on the current batch).

Items arrive in the producer's order, each once; an exception the producer raises reaches
the consumer at the item where it happened, after every item before it. At most ``depth``
finished items wait (plus the one being produced), so memory stays bounded. Closing the
consumer's generator (the loop ended early, an interrupt) stops the producer before its
next item.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

_DONE = object()
_POLL_S = 0.1   # how often a producer blocked on a full queue checks that it is still wanted


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


def prefetched(items: Iterable[T], depth: int = 1, name: str = "prefetch") -> Iterator[T]:
    """``items``, produced in a daemon thread up to ``depth`` items ahead (``depth`` <= 0:
    in the caller's thread, as a plain iteration)."""
    if depth <= 0:
        yield from items
        return
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(value) -> bool:
        while not stop.is_set():
            try:
                ready.put(value, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:   # handed to the consumer, raised there
            put(_Raised(exc))
            return
        put(_DONE)

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                worker.join()   # it has finished its last item: nothing of it outlives the loop
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        # An early end does not wait for an item in production (a read may be slow): the
        # producer drops it and stops.
        stop.set()
