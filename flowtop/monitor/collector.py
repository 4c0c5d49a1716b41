"""The collector: a zmq.asyncio XSUB bound where probes connect. No Textual.

Frames are drained in batches (one poll, then non-blocking receives on a
synchronous shadow of the same socket — an await per message halves the rate),
decoded and validated by :mod:`probe.wire`, and applied to the :class:`Model`.
Commands (``kernels_now``) go back upstream on the same XSUB socket, so only probes that
connected to this monitor (CURVE-admitted where keys are set) ever hear them, and a probe
listens on no port that anyone else could reach.

It runs on the monitor's data thread (flowtop.monitor.datathread; never on the UI's loop): the drain
loop also ticks the model at the fixed cadence of flowtop.monitor.ticker, on the pause-free monitor
clock of flowtop.monitor.clock, and hands each tick's snapshot to :attr:`Collector.on_tick`. Errors the
user must hear of (a recording that stopped, a listener that cannot accept) become notices
(flowtop.monitor.notices), not stderr lines.

Sockets, addresses and security (the XSUB's setup, CURVE, loopback-only binding) are in
flowtop.monitor.collector_net, whose names stay importable from here; the fitting of the monitor's
load (the pace asked of the ranks, the spread of large jobs' ticks) is flowtop.monitor.governor's.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any, Callable

import zmq
import zmq.asyncio

from flowtop.monitor.clock import TICK_S, MonitorClock
from flowtop.monitor.collector_net import ZAP_DOMAIN as ZAP_DOMAIN
from flowtop.monitor.collector_net import _LISTENER_EVENTS as _LISTENER_EVENTS
from flowtop.monitor.collector_net import AddressError as AddressError
from flowtop.monitor.collector_net import bind_hint
from flowtop.monitor.collector_net import CollectorSockets as CollectorSockets
from flowtop.monitor.collector_net import check_listen as check_listen
from flowtop.monitor.collector_net import is_ipv6 as is_ipv6
from flowtop.monitor.collector_net import is_loopback as is_loopback
from flowtop.monitor.collector_net import parse_tcp as parse_tcp
from flowtop.monitor.collector_net import raise_fd_limit as raise_fd_limit
from flowtop.monitor.collector_net import tcp_addr as tcp_addr
from flowtop.monitor.fdwatch import FdHeadroom
from flowtop.monitor.hello_asks import HelloAsks
from flowtop.monitor.kernel_asks import KernelAsks
from flowtop.monitor.governor import LoadGovernor
from flowtop.monitor.model import Model
from flowtop.monitor.rotation import RANKS_PER_TICK
from flowtop.monitor.rankkernels import decode_frame
from flowtop.monitor.pacing import BEHIND_S, DATA_CPU, BusyMeter, Pacer
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.relayrecord import relayed_record
from flowtop.monitor.thinning import Thinner, recorded
from flowtop.monitor.ticker import Ticker
from probe import wire

if TYPE_CHECKING:
    from flowtop.monitor.datathread import UiTurn
    from flowtop.monitor.kernel_worker import KernelWorker
    from flowtop.monitor.notices import Notices

#: Most frames handled per drain, and fewest seconds a drain may take (more after slow ticks),
#: before the loop gets its turn again (ticks stay on time; commands from the UI are served).
BATCH = 20_000
DRAIN_S = 0.05
#: Most ranks for which a glance is published between two ticks (see Collector._next_glance):
#: a glance brings each rank's step and liveness only (a light copy of its view, a few µs), so
#: twice the ranks a tick rebuilds in full still cost less than a tick does.
GLANCE_RANKS = 2 * RANKS_PER_TICK
#: Ticks due at once beyond which the older are skipped (a tick longer than the cadence).
MAX_BEHIND = 4
#: While the monitor is behind its ranks (pacing.BEHIND_S), the UI is handed at most one snapshot
#: this often: showing 4,096 ranks takes the interpreter from the frames (~100 ms a show, 13-18 %
#: of it at 2 Hz), and at that load a rank's figures change once a round anyway.
BEHIND_HAND_OVER_S = 1.0


class Collector(CollectorSockets, LoadGovernor):
    """Receives probe messages into a :class:`Model`; a ``SnapshotSource`` for the UI."""

    #: Its ranks can be asked for a kernel window (:meth:`request_kernels`).
    can_capture = True

    def __init__(
        self,
        model: Model,
        listen: str = wire.DEFAULT_ADDR,
        allow_remote: bool = False,
        recorder: Any = None,
        curve: Any = None,
        clock: MonitorClock | None = None,
        tick_s: float = TICK_S,
        cpu_budget: float | None = DATA_CPU,
    ) -> None:
        self.model = model
        #: The monitor clock every receive stamp, tick and snapshot reads (pauses taken out).
        self.clock = clock or MonitorClock()
        self.tick_s = tick_s
        self.ticker: Ticker | None = None  # from start(): ticks on the clock from then on
        #: Called on the loop with each tick's snapshot (the data thread hands it to the UI).
        self.on_tick: Callable[[MonitorSnapshot], None] | None = None
        self._pauses_told = 0
        self.recorder = recorder  # flowtop.monitor.recording.Recorder: raw frames to replay later
        self.last_recorder = recorder  # kept after stop, for its error
        self.curve = curve  # flowtop.tools.keys.ServerKeys: encrypted, only admitted probes
        self.listen = check_listen(listen, allow_remote or curve is not None)
        self._fds = FdHeadroom(self.listen)
        self._ctx: zmq.asyncio.Context | None = None
        self._sub: Any = None
        self._send: Any = None  # a synchronous shadow of the XSUB for commands (never blocks)
        #: The ``k`` key's requests, within the monitor's budget (probe.wire.command_bound).
        self.kernel_asks = KernelAsks()
        #: Ranks it forgot (evicted while silent) asked for their hello and FLOP count again.
        self.hello_asks = model.hello_asks = HelloAsks()
        self._events: Any = None  # the XSUB's socket monitor (failed handshakes), synchronous
        self._events_async: Any = None
        self._task: asyncio.Task[None] | None = None
        #: Builds kernel windows off the loop, when the model has them.
        self.kernel_worker: KernelWorker | None = None
        self._auth: Any = None
        self._allow_remote = allow_remote
        from flowtop.monitor.limits import KernelBudget

        self._frame_at = 0.0  # receive time of the frame being decoded (its batch's)
        # On the frame's receive time, not the clock's: a replay then refuses the same windows.
        self._kernel_budget = KernelBudget(model.limits, lambda: self._frame_at, lambda: model.spread)
        #: Why :meth:`start` failed ("" until it does); the CLI reports it after the UI closes.
        self.start_error = ""
        #: The errno of a failed bind (None until one fails): EADDRINUSE means another monitor has it.
        self.bind_errno: int | None = None
        #: When the glance between two ticks is due: a snapshot of steps and liveness only (the
        #: figures, statuses and hints of the last tick), so that a step shows on screen within a
        #: quarter second plus its flush, not half a second — for up to GLANCE_RANKS ranks, where it
        #: costs little.
        self._next_glance = float("inf")
        #: Whether to publish glances at all: a TUI sets it (flowtop.tui.app); a JSON stream, a scrape
        #: or a final snapshot wants each tick's consistent view only.
        self.glances = False
        #: The pace asked of the ranks (flowtop.monitor.pacing), checked every RENEW_S (see LoadGovernor).
        self.pacer = Pacer(cpu_budget)
        self._pace_check = 0.0
        #: Ranks the model held at the last renewal, and the most it held since: ranks that join
        #: between two renewals (a large job starting) may need a longer pace at once (Pacer.ramp;
        #: counted as joined, not as all the model holds: it may still hold a job that ended).
        self._ranks_at_renewal = self._ranks_seen = 0
        #: The drain loop's busy share between two pace checks (the pacer's measure of load).
        self.busy = BusyMeter()
        self._told_pace: float | None = None  # the pace the user was last told of ...
        self._told_load_bound = False  # ... and whether the monitor's load set it
        self._told_pace_at = -math.inf  # ... and when
        #: How thinly large jobs' ticks are spread when they crowd out frames (checked with the pace).
        self.thinner = Thinner(cpu_budget)
        self._handed_at = -float("inf")  # when a tick's snapshot was last handed on (see _hand_over)
        #: A UI's turn at the interpreter (flowtop.monitor.datathread.UiTurn; the data thread sets
        #: it where a UI renders the snapshots): given between frames and before ticks.
        self.ui_turn: UiTurn | None = None

    async def start(self) -> None:
        """Bind the sockets (inside the running loop) and start receiving.

        Raises :class:`AddressError` when the address cannot be bound; any failure is also
        kept in :attr:`start_error`.
        """
        try:
            await self._start()
        except Exception as exc:
            self.start_error = self.start_error or f"{type(exc).__name__}: {exc}"
            raise

    async def _start(self) -> None:
        raise_fd_limit()
        # Everything that needs a descriptor comes before the bind (the socket monitor's pipe, the
        # kernel worker, the descriptor count): once bound, libzmq accepts probe connections on its
        # own thread, and at a low open-file limit they can take every descriptor left (an import,
        # the monitor pipe, a worker would then fail: EMFILE).
        sub = self._open_sockets()
        if self.model.builds_kernels:
            from flowtop.monitor.kernel_worker import KernelWorker
            from flowtop.monitor.rankkernels import build_window

            self.kernel_worker = KernelWorker(self.model, build_window, processes=True)
            self.model.offload_kernels(self.kernel_worker.submit)
        low = self._fds.at_start(self.model.limits.max_ranks_per_job)  # room for the largest job admitted?
        try:
            sub.bind(self.listen)
        except zmq.ZMQError as exc:
            # zmq.strerror: str(exc) repeats the address ("... (addr='tcp://...')") the text names first
            reason = zmq.strerror(exc.errno) if exc.errno else str(exc)
            self.start_error = f"cannot bind {self.listen}: {reason}{bind_hint(exc.errno)}"
            self.bind_errno = exc.errno
            await self.stop()
            raise AddressError(self.start_error) from None
        t0 = self.clock.now()
        self.busy = BusyMeter()  # from the first receive on
        self.ticker = Ticker(lambda at: self.model.tick(at, self.listen), t0, self.tick_s, max_behind=MAX_BEHIND)
        self._next_glance = t0 + self.tick_s / 2
        if self.recorder is not None:
            self.recorder.start(t0)  # recorded times count from the tick schedule's origin
            if not self.recorder.running and self.recorder.error:  # said now, not only at the exit
                self.model.notices.error(self.recorder.error, t0)
            if self.recorder.kept_aside is not None:
                self.model.notices.warning(f"{self.recorder.path} held an earlier file: kept as "
                                           f"{self.recorder.kept_aside}, this recording starts afresh", t0)
        if low:
            self.model.notices.warning(low, t0)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self._drain_forever()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the listener is lost: say so, the UI stays up to read it
            self.model.notices.error(f"stopped receiving on {self.listen}: {type(exc).__name__}: {exc}",
                                     self.clock.now())
            self.catch_up()
        finally:
            # The waits' reader goes with the drain: left registered, a descriptor nobody re-arms
            # (ZMQ_EVENTS unread) stays readable and the loop ran its callback ~280 k times a second
            # (a core) from a probe's connect on, for as long as the UI stayed up.
            self._stop_reading()

    async def _drain_forever(self) -> None:
        sync: zmq.Socket[bytes] = zmq.Socket.shadow(self._sub.underlying)  # non-blocking drain without awaits
        assert self.ticker is not None
        while True:
            # Never wait past the next tick: ticks keep their cadence, and the clock is read at
            # least that often (a longer gap between reads is a pause of the monitor itself).
            wait_ms = 1000 * (min(self.ticker.next_at, self._next_glance) - self.clock.now())
            await self._wait_frames(sync, max(1, min(500, int(wait_ms) + 1)) / 1000)
            ui_turn = self.ui_turn
            if ui_turn is not None:
                self.busy.away(ui_turn.give())  # a tick now would share the interpreter with the UI's refresh
            started = time.perf_counter()
            now = self.catch_up()  # every tick due before this batch's receive time runs first
            # Receiving gets at least as long as the ticks just took: a monitor whose ticks are
            # slow (thousands of ranks, a flood of forged ones) still takes frames in at half speed.
            drain_from = time.perf_counter()
            ticked = drain_from - started
            deadline = drain_from + max(DRAIN_S, ticked)
            # Seconds of the drain given to the UI: not busy. A tick just now may have handed the
            # UI a snapshot: its turn is given from here, not 16 frames (relay batches) into the drain.
            given = ui_turn.give() if ui_turn is not None else 0.0
            for i in range(BATCH):
                try:
                    parts = sync.recv_multipart(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                if len(parts) == 1:
                    self.handle_frame(parts[0], now)
                else:  # a node relay's batch (flowtop.monitor.relays)
                    self.handle_batch(parts, now, self.clock.now())
                if i % 16 == 15:
                    if ui_turn is not None:
                        given += ui_turn.give()
                    if i % 64 == 63 and time.perf_counter() > deadline + given:
                        break
            self.busy.add(time.perf_counter() - drain_from - given, ticked)
            self.busy.away(given)
            self._socket_events()
            await asyncio.sleep(0)

    def catch_up(self) -> float:
        """Run the ticks due by the clock now (handing each batch's last snapshot to
        :attr:`on_tick`) and return that time; called by the drain loop and by the data thread."""
        now = self.clock.now()
        self._tell_pauses(now)
        full = self._fds.check(now)
        if full:
            self.model.notices.error(full, now)
        if self.ticker is not None:
            snap = self.ticker.catch_up(now)
            if snap is not None:
                self._next_glance = self.ticker.next_at - self.tick_s / 2
                if self.on_tick is not None and self._hand_over(now):
                    self.on_tick(snap)
            elif now >= self._next_glance:
                self._next_glance = self.ticker.next_at  # one glance between two ticks
                if self.glances and self.on_tick is not None and 0 < len(self.model.ranks) <= GLANCE_RANKS:
                    self.on_tick(self.model.snapshot(now, self.listen, light=True))
        self._govern(now)
        self._ask_hellos(now)
        if self.recorder is not None:
            try:
                self.recorder.flush_due(now)  # a SIGKILL loses at most recfile.FLUSH_S of it
            except Exception as exc:
                self._stop_recording(exc)
        return now

    def _hand_over(self, now: float) -> bool:
        """Whether to hand this tick's snapshot on (every tick, but see BEHIND_HAND_OVER_S)."""
        if self.pacer.behind_s > BEHIND_S and now - self._handed_at < BEHIND_HAND_OVER_S:
            return False
        self._handed_at = now
        return True

    def _tell_pauses(self, now: float) -> None:
        pauses = self.clock.pauses
        if len(pauses) > self._pauses_told:
            self._pauses_told = len(pauses)
            self.model.notices.add(
                "information", f"the monitor did not run for {pauses[-1].length_s:.0f} s (paused or starved); "
                "ranks' silence is counted without that time", now)

    @property
    def notices(self) -> "Notices":
        """Monitor-side errors for the user (the model's board)."""
        return self.model.notices

    @property
    def published(self) -> MonitorSnapshot | None:
        """The snapshot of the latest tick (None before the first)."""
        return self.ticker.last if self.ticker is not None else None

    def handle_batch(self, parts: list[bytes], now: float, taken: float | None = None) -> None:
        """A relay's ``[stamp, frame, ...]``: each frame applied at the time the relay got it
        (``taken``: when the drain took it off the socket, see Relays.unstamp)."""
        if self.recorder is not None:  # its stamp first: a replay applies the frames as here
            delay = taken - now if taken is not None and taken > now else 0.0
            self._record(now, relayed_record(parts[0], len(parts) - 1, delay), received=False)
        try:
            via, times = self.model.relays.unstamp(parts, now, taken)
        except wire.WireError as exc:
            self.model.reject(str(exc))
            return
        for frame, t in zip(parts[1:], times):
            self.handle_frame(frame, now, via, t)

    def handle_frame(self, frame: bytes, now: float, via: str | None = None, at: float | None = None) -> None:
        """Decode one frame and apply it; a bad frame is counted, never raised. A relayed frame
        (``via``) counts at ``at``, when its relay received it, but is recorded at ``now``, its
        arrival, so that a replay feeds frames in the order the live monitor saw them."""
        if self.recorder is not None:
            self._record(now, recorded(frame))
        self._frame_at = now
        try:
            # A known rank's kernel window only as far as its envelope: its builder decodes the rest.
            msg = decode_frame(frame, self.model.builds_kernels, self.model.knows, self._kernel_budget)
        except wire.WireError as exc:
            self.model.reject(str(exc))
            return
        if msg.steps is not None:
            self.busy.steps += 1  # the pacer's measure of what got through
        try:
            self.model.ingest(msg, now if at is None else at, via)
        except Exception as exc:  # a hostile-but-valid message must not kill the monitor
            self.model.reject(f"ingest: {type(exc).__name__}: {exc}")

    def _record(self, now: float, frame: bytes, received: bool = True) -> None:
        assert self.recorder is not None
        try:
            self.recorder.write(now, frame, received)
        except Exception as exc:  # disk full, file gone: stop recording, keep monitoring
            self._stop_recording(exc)

    def _stop_recording(self, exc: Exception) -> None:
        recorder, self.recorder = self.recorder, None
        path = getattr(recorder, "path", "?")
        frames = getattr(recorder, "frames", 0)
        self.model.notices.error(
            f"recording to {path} stopped after {frames} frames: {type(exc).__name__}: {exc}; monitoring goes on",
            self.clock.now(),
        )
        recorder.close(f"{type(exc).__name__}: {exc}", self.clock.now())  # the why, in its end marker if it fits
        recorder.error = f"recording {path} stopped after {frames} frames: {exc}"  # the cause, not the marker's fate

    def snapshot(self) -> MonitorSnapshot:
        """An immutable snapshot of the model now (a pure read; the ticks advance the model)."""
        return self.model.snapshot(self.clock.now(), self.listen)

    async def stop(self) -> None:
        """Stop receiving and close the sockets; say the notices not due yet (Model.flush_notices)."""
        self.model.flush_notices(self.published)
        if self.kernel_worker is not None:
            self.kernel_worker.close()
            self.kernel_worker = None
            self.model.build_kernels_here()  # a later replay into this model builds inline
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._send = None  # a shadow of the socket closed below
        if self._ctx is not None and not self._ctx.closed:  # else closed already (a start that failed to bind)
            self._close_sockets()
        if self.recorder is not None:
            self.recorder.close(now=self.clock.now())
