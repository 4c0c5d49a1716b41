"""``flowtop top --prometheus`` as a user runs it: a real process on a pseudo-terminal (200x50),
fed by a real probe publisher, scraped over HTTP while the TUI draws, then quit with ``q``: exit
status 0 and both ports (the monitor's and the metrics') released."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pty
import select
import signal
import socket
import struct
import sys
import termios
import threading
import time
from typing import Iterator

from flowtop.tools.demo.launch import free_port_pair
from probe.transport.publisher import Publisher
from probe.wire import RankKey
from test_prometheus import PEAK, MODEL_FLOPS, WALL_S, by_name, http_get, publisher, train

ROWS, COLS = 50, 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Terminal:
    """A child process on a pty; everything it writes is kept (the screen's bytes)."""

    def __init__(self, argv: list[str], ignore: tuple[int, ...] = ()) -> None:
        """``ignore``: signals the child starts with ignored (as ``nohup`` leaves SIGHUP)."""
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(COLS), LINES=str(ROWS))
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: size its terminal before Textual reads it
            try:
                for sig in (signal.SIGHUP, signal.SIGTERM):  # as a login shell leaves them, whoever
                    # started the tests (under nohup SIGHUP arrives ignored, and stays so through exec)
                    signal.signal(sig, signal.SIG_IGN if sig in ignore else signal.SIG_DFL)
                fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
                os.execve(sys.executable, [sys.executable, *argv], env)
            finally:
                os._exit(127)
        self.out = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if ready:
                    chunk = os.read(self.fd, 65536)
                    if not chunk:
                        return
                    self.out += chunk
            except OSError as exc:  # EIO: the child closed its side
                if exc.errno in (errno.EIO, errno.EBADF):
                    return
                raise

    def screen_has(self, text: str) -> bool:
        return text.encode() in self.out

    def until(self, text: str, deadline: float) -> None:
        """Wait until ``text`` is on screen (by monotonic ``deadline``; else fail with the screen)."""
        while not self.screen_has(text):
            assert time.monotonic() < deadline, bytes(self.out[-2000:])
            time.sleep(0.1)

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """The exit status (a signal as -N), or None if still running after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        return None

    def kill(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0
        self._reader.join(2)
        os.close(self.fd)


def released(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port and a new server could bind it (as flowtop would:
    SO_REUSEADDR, so connections in TIME_WAIT do not count)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        pass
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    return True


@contextlib.contextmanager
def top_fed(listen: str, args: list[str], key: RankKey, steps: int) -> Iterator[tuple[Terminal, Publisher]]:
    """``flowtop top --listen LISTEN ARGS`` on a terminal, drawn, and a real publisher of ``key``
    that sent ``steps`` steps, a FLOP count and telemetry to it; both closed at the end."""
    term = Terminal(["-m", "flowtop.cli", "top", "--listen", listen, *args])
    pub: Publisher | None = None
    try:
        term.until("Quit", time.monotonic() + 60)  # the footer: the app is up and drew its screen
        pub = publisher(listen, key, 1, 0)
        train(pub, steps)
        yield term, pub
    finally:
        if pub is not None:
            pub.close()
        term.kill()


def test_top_with_prometheus_in_a_terminal_scrapes_then_quits_on_q() -> None:
    monitor_port, metrics_port = free_port_pair(), free_port()
    listen = f"tcp://127.0.0.1:{monitor_port}"
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with top_fed(listen, ["--prometheus", f"127.0.0.1:{metrics_port}"], RankKey("pty-job", "node-p", 4343, 0, 0),
                 30) as (term, _):
        deadline = time.monotonic() + 60
        while True:  # scraped while the TUI runs and shows the same job
            text = http_get(url)
            mfu = by_name(text, "flowtop_rank_mfu_ratio")
            if mfu and term.screen_has("pty-job"):
                break
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.2)
        (sample,) = mfu
        assert sample.labels["train_job"] == "pty-job" and sample.labels["host"] == "node-p"
        assert abs(sample.value - MODEL_FLOPS / WALL_S / PEAK) < 0.01 * MODEL_FLOPS / WALL_S / PEAK
        assert by_name(http_get(url), "process_cpu_seconds_total")  # a second scrape: the fresh part
        term.type("q")
        assert term.wait(30) == 0, bytes(term.out[-2000:])
        assert released(metrics_port) and released(monitor_port)
