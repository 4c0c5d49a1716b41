"""Capture what an attached probe publishes, its common step's rows included.

The step tracker queues its common (quiet) step as a row straight into the publisher's queue,
not through ``publish`` (probe.transport.steprows): a test that replaced ``publish`` alone would
see only the steps the runtime published itself. :func:`spy` captures both, in order, each row
as the record the sender makes of it.
"""

from __future__ import annotations

from typing import Any, Callable

from probe.transport.steprows import ROW_LEN, TrainingQueue, step_fields

Captured = list[tuple[str, dict[str, Any]]]


class RowSpy(TrainingQueue):
    """Stands in for the tracker's queue: each row appended becomes ``("step", record)`` in
    ``out`` (and goes on to ``then``, the real queue, when given)."""

    def __init__(self, out: Captured, then: TrainingQueue | None = None) -> None:
        super().__init__(1)
        self.out, self.then = out, then

    def append(self, entry: Any) -> None:
        if len(entry) == ROW_LEN:
            self.out.append(("step", step_fields(entry)))
        if self.then is not None:
            self.then.append(entry)
            self.then.appended += 1


def spy(p: Any, out: Captured, forward: bool = False) -> None:
    """Capture what probe ``p`` publishes into ``out`` as ``(kind, fields)``; ``forward``: and
    still send it."""
    publish: Callable[[str, dict[str, Any]], None] = p.publisher.publish

    def captured(kind: str, fields: dict[str, Any]) -> None:
        out.append((kind, fields))
        if forward:
            publish(kind, fields)

    p.publisher.publish = captured
    p.tracker._queue = RowSpy(out, p.publisher.queue if forward else None)
