"""StatusFooter: the key footer, with the recording state and the monitor's own CPU at its right."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Footer, Static

from flowtop.monitor import selfload

#: Seconds between two CPU readings shown (the meter's window is longer: the figure is steady).
EVERY_S = 2.0


def recording_state(source: Any) -> Text:
    """``REC`` while the live monitor records (``REC stopped`` once it failed), ``replay`` when
    playing a recording back, nothing otherwise (a prepared list of snapshots: the tests; a
    monitor that could not bind its address, whose recording never started)."""
    from flowtop.monitor.recording import RecordingSource

    if isinstance(source, RecordingSource):
        return Text("replay", style="bold cyan")
    recorder = getattr(source, "recorder", None)
    if recorder is not None and recorder.running:
        return Text("REC", style="bold red")
    last = getattr(source, "last_recorder", None)
    if last is not None and getattr(last, "error", None):
        return Text("REC stopped", style="bold yellow")
    return Text()


def status_text(source: Any, load: selfload.Load | None) -> Text:
    """What the right end of the footer says: the recording state, then ``cpu N%``."""
    out = recording_state(source)
    if load is not None and load.cpu_ratio is not None:
        if out:
            out.append(" ")
        out.append(f"cpu {load.cpu_ratio * 100:.0f}%", style="dim" if load.cpu_ratio < 0.5 else "bold yellow")
    return out


class StatusFooter(Horizontal):
    """The footer line: Textual's key footer and, at its right, the recording state and the
    monitor's CPU (refreshed every :data:`EVERY_S` while the app takes snapshots on a cadence;
    never in tests at ``refresh_s=0``). The status sits beside the footer, not in it, so the
    footer's recompose on a key change leaves it alone."""

    DEFAULT_CSS = """
    StatusFooter {
        dock: bottom;
        height: 1;
        width: 100%;
        background: $footer-background;
    }
    StatusFooter > Footer {
        dock: none;
        width: 1fr;
    }
    StatusFooter > #monitor-status {
        width: auto;
        height: 1;
        padding: 0 1;
        background: $footer-background;
    }
    """

    #: The meter read (the process's; tests give their own).
    meter: selfload.LoadMeter = selfload.METER

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.load: selfload.Load | None = None

    def compose(self) -> ComposeResult:
        yield Footer()
        text = self._text()
        label = Static(text, id="monitor-status")
        label.display = bool(text.plain)  # nothing to say: no cell taken from the keys
        yield label

    def on_mount(self) -> None:
        if getattr(self.app, "refresh_s", 0) > 0:
            self.set_interval(EVERY_S, self.update_status)
            self.meter.read()  # the first reading: the base of the rate

    def update_status(self) -> None:
        """Take a reading and show it."""
        self.load = self.meter.read()
        text = self._text()
        label = self.query_one("#monitor-status", Static)
        label.update(text)
        label.display = bool(text.plain)

    def recheck(self) -> None:
        """Show the recording state now if it changed (a monitor that could not bind closed its
        recording): no reading of the meter, no repaint when nothing changed."""
        text = self._text()
        label = self.query_one("#monitor-status", Static)
        if text.plain != str(label.render()):
            label.update(text)
            label.display = bool(text.plain)

    def _text(self) -> Text:
        return status_text(getattr(self.app, "source", None), self.load)
