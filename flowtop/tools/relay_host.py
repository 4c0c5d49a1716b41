"""Who runs a node's relay: ``flowtop relay`` itself, or the ``flowtop run`` processes of the node.

Every ``flowtop run`` that relays points its ranks at the node's well-known address (an ipc path
keyed by user, monitor address and keys: :func:`flowtop.tools.relay.node_address`) and keeps one thread
waiting on that path's lock. Whoever holds the lock hosts the relay; the others' ranks simply
connect to it. When the host's command ends, it flushes, says "closing" upstream and releases the
lock; the kernel wakes one waiting ``flowtop run`` at once, which binds the same path, and the
remaining ranks reconnect to it as to a restarted monitor (their probes hold frames meanwhile).
A host that dies (kill -9, OOM) releases the lock the same way. So the node keeps one upstream
connection for as long as any ``flowtop run`` of it lives, and no relay outlives the last one:
nothing is left behind on the node after the job. A ``flowtop relay`` started by hand on the same
address takes the same lock, and the ``flowtop run`` processes then wait behind it.

The relay runs in the ``flowtop run`` process, never in a training process: its work takes no
share of a rank's interpreter lock.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from flowtop.tools.relay import PathLock, Relay, RelayConfig, RelayError, check_upstream, node_address

#: ``flowtop run --relay`` choices.
MODES = ("auto", "on", "off")


def wants_relay(mode: str, upstream: str) -> bool:
    """``on``; ``off``; ``auto``: relay when the monitor is on another host (tcp, not loopback),
    where one connection per node matters. A monitor on this host gains nothing from a hop."""
    if mode != "auto":
        return mode == "on"
    from flowtop.monitor.collector import AddressError, is_loopback, parse_tcp

    try:
        host, _ = parse_tcp(upstream)
    except AddressError:
        return False
    return not is_loopback(host)


class NodeRelay:
    """``flowtop run``'s share of the node relay for ``upstream``: hosts it while holding the lock."""

    def __init__(self, upstream: str, curve_dir: str | None) -> None:
        check_upstream(upstream)
        self.address = node_address(upstream, curve_dir)
        self._cfg = RelayConfig(self.address, upstream, curve_dir, hosted_by="flowtop run")
        Relay(self._cfg)  # bad keys or addresses fail here, in the caller, not in the thread
        self._lock = PathLock(self.address[len("ipc://"):])
        self._mutex = threading.Lock()
        self._stopping = False
        self.relay: Relay | None = None
        #: Times this process took over the node's relay.
        self.hosted = 0
        self._thread = threading.Thread(target=self._run, name="flowtop-node-relay", daemon=True)

    def start(self) -> "NodeRelay":
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self._lock.acquire(blocking=True)  # returns once the node has no relay
            except OSError as exc:
                print(f"flowtop run: node relay lock {self._lock.path}: {exc}; ranks wait for another relay",
                      file=sys.stderr)
                return
            with self._mutex:
                if self._stopping:
                    self._lock.release()
                    return
                relay = self.relay = Relay(self._cfg)
            self.hosted += 1
            try:
                relay.run()
            except RelayError as exc:
                print(f"flowtop run: node relay: {exc}", file=sys.stderr)
                time.sleep(1.0)  # the path is taken by something else: try again, never spin
            except Exception as exc:  # never let the relay take flowtop run (and so the job) down
                print(f"flowtop run: node relay stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
                time.sleep(1.0)
            finally:
                self._lock.release()
            with self._mutex:
                if self._stopping:
                    return

    def stop(self, timeout_s: float = 3.0) -> None:
        """Hand the node over: flush and close a relay hosted here, release the lock."""
        with self._mutex:
            self._stopping = True
            relay = self.relay
        if relay is not None:
            relay.stop()
            self._thread.join(timeout_s)


def for_run(mode: str, upstream: str, curve_dir: str | None) -> NodeRelay | None:
    """The node relay ``flowtop run`` uses, started; None to connect directly (a failure is said
    once on stderr and the ranks connect directly: monitoring must never cost the run)."""
    if not wants_relay(mode, upstream):
        return None
    if upstream.startswith("ipc://"):  # was said as "bad address" of the very address the ranks then used
        print(f"flowtop run: --relay on: {upstream} is a node relay's address already (a relay cannot "
              "sit behind another); ranks connect to it directly", file=sys.stderr)
        return None
    try:
        return NodeRelay(upstream, curve_dir).start()
    except RelayError as exc:
        print(f"flowtop run: no node relay ({exc}); ranks connect to {upstream} directly", file=sys.stderr)
        return None


def _same_tcp(a: str, b: str) -> bool:
    """Whether two addresses are the same tcp://HOST:PORT (as written: a name and its address differ)."""
    from flowtop.monitor.collector import AddressError, parse_tcp

    try:
        return parse_tcp(a) == parse_tcp(b)
    except AddressError:
        return False


def serve(listen: str | None, upstream: str, curve_dir: str | None) -> int:
    """``flowtop relay``: run a relay until SIGTERM/SIGINT; 2 with a message on bad input."""
    try:
        check_upstream(upstream)
        listen = listen or node_address(upstream, curve_dir)
        relay = Relay(RelayConfig(listen, upstream, curve_dir))
        if _same_tcp(listen, upstream):
            raise RelayError(f"--listen {listen} is the monitor's address (--connect): the relay would send to itself")
    except RelayError as exc:
        print(f"flowtop relay: {exc}", file=sys.stderr)
        return 2
    lock = None
    if listen.startswith("ipc://"):
        lock = PathLock(listen[len("ipc://"):])
        try:
            held = not lock.acquire(blocking=False)
        except OSError as exc:
            print(f"flowtop relay: cannot lock {lock.path}: {exc.strerror}", file=sys.stderr)
            return 2
        if held:
            print(f"flowtop relay: another relay serves {listen} (lock {lock.path} is held)", file=sys.stderr)
            return 2

    def stop(_signum: int, _frame: Any) -> None:
        relay.stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    threading.Thread(target=_say_ready, args=(relay, listen, upstream, curve_dir), name="flowtop-relay-ready",
                     daemon=True).start()
    try:
        relay.run()
    except RelayError as exc:
        print(f"flowtop relay: {exc}", file=sys.stderr)
        return 2
    finally:
        if lock is not None:
            lock.release()
    return 0


def _say_ready(relay: Relay, listen: str, upstream: str, curve_dir: str | None = None) -> None:
    """Once the relay has bound its address (never before: a busy address printed where ranks
    connect, then that it could not bind): where ranks connect — the command a rank runs, not
    FLOWTOP_ADDR alone: without `flowtop run` (or an attach in the script) no probe is loaded to
    read it — and, as `flowtop run` says them, that no monitor listens upstream yet, or that what
    listens there is not a flowtop monitor (flowtop.tools.peer_check, on this thread)."""
    relay.ready.wait()
    if relay.error:
        return  # run() raises it: said once, by serve
    print(f"flowtop relay {relay.id}: ranks connect to {listen} (flowtop run --connect {listen} -- CMD); "
          f"forwarding to {upstream}", file=sys.stderr, flush=True)
    from flowtop.tools.listening import no_monitor_note

    note = no_monitor_note(upstream, curve_dir)
    if note:
        print(f"flowtop relay: {note}", file=sys.stderr, flush=True)
        return
    from flowtop.tools.peer_check import check_peer, peer_note
    from flowtop.tools.relay_setup import client_keys

    keys = client_keys(curve_dir)  # loaded once already by Relay: they load
    note = peer_note(upstream, check_peer(upstream, keys, relay.stopping), keys is not None)
    if note and not relay.stopping.is_set():
        print(f"flowtop relay: {note}", file=sys.stderr, flush=True)
