"""Host telemetry (psutil) for one training process: its CPU, memory, threads and child processes.

Child processes are where DataLoader workers run, so their number and CPU use show whether input
loading keeps up; children that are not multiprocessing workers are counted apart, and the
workers of a fork server (its children) are counted as the job's. Runs on the probe's sender
thread at most once a second; ``sample()`` never raises.

Children are read from ``/proc/<pid>/task/<tid>/children`` (one small file per thread of the
process), not with psutil's ``children()``, which reads the ``stat`` file of every process on
the host: ~8 ms per sample with 100 processes, more on a busy training node, and every rank of
the node does it each second. Where those files are missing (a kernel without
CONFIG_PROC_CHILDREN), psutil's scan is the fallback.

CPU percentages come from CPU-time deltas between calls. psutil's own ``cpu_percent()`` answers 0.0
on its first call; instead, the first reading of a process (or of the host) is its average since it
started (since boot for the host), so a freshly spawned worker never shows a fake 0 %.
"""

from __future__ import annotations

import os
import time
from typing import Any

from probe._log import warn_once

# CPU times tick at 100 Hz: over a few milliseconds one tick reads as hundreds of percent. Readings
# closer together than this repeat the previous figure instead of dividing noise by a tiny interval.
MIN_WINDOW_S = 0.25

HOST_FIELDS: tuple[str, ...] = (
    "proc_cpu_pct", "rss_bytes", "threads", "workers", "workers_cpu_pct", "children",
    "host_cpu_pct", "host_mem_used", "host_mem_total",
)


#: A child younger than this may not have exec'd yet and still shows its parent's argv: its
#: worker verdict is not remembered until it is older.
SETTLED_S = 1.0


def is_forkserver(cmdline: list[str]) -> bool:
    """Whether a process is multiprocessing's fork server (its workers are *its* children)."""
    return "multiprocessing.forkserver" in " ".join(cmdline)


def is_worker(child_cmdline: list[str], parent_cmdline: list[str]) -> bool:
    """Whether a child process is a multiprocessing worker (DataLoader workers are): a forked one
    keeps its parent's argv, a spawned one runs multiprocessing's bootstrap (forkserver workers
    are children of the fork server: see :func:`is_forkserver`). Other children — a compile-worker
    pool, a logger's service process, a monitor the script started — are not input workers (on
    an H200 run the script's own monitor counted as a "worker")."""
    if child_cmdline and child_cmdline == parent_cmdline:
        return True
    joined = " ".join(child_cmdline)
    return "multiprocessing" in joined and ("spawn_main" in joined or "--multiprocessing-fork" in joined)


def child_pids(pid: int) -> list[int] | None:
    """Pids of ``pid``'s live and zombie children, from each of its threads' ``children`` file;
    None where the kernel has no such files (or ``pid`` is gone)."""
    task = f"/proc/{pid}/task"
    if not os.path.exists(f"{task}/{pid}/children"):
        return None
    pids: list[int] = []
    try:
        tids = os.listdir(task)
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"{task}/{tid}/children", "rb") as fh:
                pids.extend(int(field) for field in fh.read().split())
        except OSError:  # the thread ended meanwhile: it has no children left to list
            continue
    return pids


def _cpu_seconds(times: Any) -> float:
    return float(times.user) + float(times.system)


class HostTelemetry:
    """psutil readings for process ``pid`` (default: this process) and the host."""

    def __init__(self, pid: int | None = None) -> None:
        """Cheap; nothing is read until ``sample()``."""
        self._pid = os.getpid() if pid is None else pid
        self._proc: Any = None
        self._psutil: Any = None
        self._fatal: str | None = None
        # (pid, create_time) -> (monotonic time, cpu seconds, last %) at the previous reading; the
        # key includes create_time so a recycled pid starts fresh.
        self._prev: dict[tuple[int, float], tuple[float, float, float]] = {}
        #: This sample's time on the monotonic clock: the window between two readings (a step of
        #: the wall clock, NTP's, would freeze a figure for as long or dilute one).
        self._at = time.monotonic()
        self._host_prev: tuple[float, float, float] | None = None  # (busy s, total s, last %)
        self._cmdline: list[str] | None = None  # this process's argv (forked workers share it)
        self._kinds: dict[tuple[int, float], str] = {}  # (pid, create_time) -> kind of child
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process of a child seen at the last sample

    def _init(self) -> None:
        try:
            import psutil
        except Exception as exc:
            self._fatal = f"psutil not importable: {exc}"
            return
        self._psutil = psutil
        try:
            self._proc = psutil.Process(self._pid)
        except Exception as exc:
            self._fatal = f"process {self._pid} not readable: {exc}"

    def _proc_pct(self, proc: Any, now: float, seen: set[tuple[int, float]]) -> float:
        """CPU % of one core used by ``proc`` since the previous reading (or since it started)."""
        create = float(proc.create_time())
        key = (int(proc.pid), create)
        seen.add(key)
        prev, at = self._prev.get(key), self._at
        if prev is not None and at - prev[0] < MIN_WINDOW_S:
            return prev[2]
        cpu = _cpu_seconds(proc.cpu_times())
        if prev is None:  # since it started: create_time() is a wall time
            wall, used = now - create, cpu
        else:
            wall, used = at - prev[0], cpu - prev[1]
        pct = max(0.0, 100.0 * used / wall) if wall > 0 else 0.0
        self._prev[key] = (at, cpu, pct)
        return pct

    def _kind(self, child: Any, now: float) -> str:
        """"worker", "forkserver" or "other"; remembered per process once it is settled (its
        command line no longer changes), so each child's is read about once."""
        create = float(child.create_time())
        key = (int(child.pid), create)
        known = self._kinds.get(key)
        if known is not None:
            return known
        if self._cmdline is None:
            self._cmdline = list(self._proc.cmdline())
        try:
            cmd = list(child.cmdline())
        except Exception:  # unreadable: not counted as an input worker
            cmd = []
        kind = "forkserver" if is_forkserver(cmd) else "worker" if is_worker(cmd, self._cmdline) else "other"
        if now - create >= SETTLED_S:  # before that it may still be between fork and exec
            if len(self._kinds) > 4096:  # children come and go; keep the memo bounded
                self._kinds.clear()
            self._kinds[key] = kind
        return kind

    def _children(self, proc: Any) -> list[Any]:
        """``proc.children()`` without reading every process on the host (see the module doc).
        psutil.Process objects are kept between samples (pid reuse is caught by psutil itself
        through the create time: a recycled pid raises NoSuchProcess, and is read afresh)."""
        pids = child_pids(int(proc.pid))
        if pids is None:
            return list(proc.children(recursive=False))
        out = []
        for pid in pids:
            known = self._procs.get(pid)
            try:
                if known is None or not known.is_running():
                    known = self._psutil.Process(pid)
            except self._psutil.Error:
                continue  # exited between listing and reading
            out.append(known)
        if len(self._procs) > 4096:
            self._procs.clear()
        self._procs.update((p.pid, p) for p in out)
        return out

    def _worker_cpu(self, worker: Any, now: float, seen: set[tuple[int, float]]) -> tuple[int, float]:
        """(1, its CPU %) for a live worker, (0, 0.0) for a zombie."""
        with worker.oneshot():
            if worker.status() == self._psutil.STATUS_ZOMBIE:
                return 0, 0.0
            return 1, self._proc_pct(worker, now, seen)

    def _host_pct(self) -> float:
        times = self._psutil.cpu_times()
        prev = self._host_prev
        idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
        total = sum(float(v) for v in times)
        # guest time is already inside user time on Linux; counting it twice inflates the total
        total -= float(getattr(times, "guest", 0.0)) + float(getattr(times, "guest_nice", 0.0))
        busy = total - idle
        # host totals sum all cores, so MIN_WINDOW_S worth of them is cores × MIN_WINDOW_S seconds
        window = MIN_WINDOW_S * (self._psutil.cpu_count() or 1)
        if prev is not None and total - prev[1] < window:
            return prev[2]
        d_busy, d_total = (busy, total) if prev is None else (busy - prev[0], total - prev[1])
        pct = min(100.0, max(0.0, 100.0 * d_busy / d_total)) if d_total > 0 else 0.0
        self._host_prev = (busy, total, pct)
        return pct

    def sample(self) -> dict[str, Any]:
        """One reading of ``HOST_FIELDS`` (``None`` when n/a) plus ``reasons`` for each n/a.

        ``proc_cpu_pct`` and ``workers_cpu_pct`` are % of one core (top's convention, may exceed
        100); ``host_cpu_pct`` is % of all cores; ``workers`` counts live multiprocessing children
        (:func:`is_worker`), ``children`` all live direct children."""
        out: dict[str, Any] = {key: None for key in HOST_FIELDS}
        reasons: dict[str, str] = {}
        try:
            if self._psutil is None and self._fatal is None:
                self._init()
            if self._fatal is None:
                self._sample_into(out, reasons)
        except Exception as exc:  # last-resort guard: telemetry must never hurt training
            warn_once("host.sample", f"host telemetry failed: {exc!r}")
            self._fatal = f"host telemetry error: {exc!r}"
        for key in HOST_FIELDS:
            if out[key] is None:
                reasons.setdefault(key, self._fatal or "unavailable")
        out["reasons"] = reasons
        return out

    def _sample_into(self, out: dict[str, Any], reasons: dict[str, str]) -> None:
        psutil = self._psutil
        now = time.time()  # create_time() is wall-clock, so the ages since it are too
        self._at = time.monotonic()
        seen: set[tuple[int, float]] = set()
        try:
            proc = self._proc
            with proc.oneshot():
                out["proc_cpu_pct"] = self._proc_pct(proc, now, seen)
                out["rss_bytes"] = int(proc.memory_info().rss)
                out["threads"] = int(proc.num_threads())
        except Exception as exc:
            warn_once("host.proc", f"process telemetry failed: {exc!r}")
            for key in ("proc_cpu_pct", "rss_bytes", "threads"):
                reasons[key] = f"process not readable: {exc}"
        try:
            workers = children = 0
            workers_pct = 0.0
            for child in self._children(self._proc):
                try:
                    with child.oneshot():
                        if child.status() == psutil.STATUS_ZOMBIE:
                            continue
                        children += 1
                        kind = self._kind(child, now)
                    if kind == "forkserver":  # DataLoader workers started by the fork server
                        for worker in self._children(child):
                            try:
                                n, pct = self._worker_cpu(worker, now, seen)
                            except (psutil.NoSuchProcess, psutil.AccessDenied):
                                continue  # one worker exiting must not hide its siblings
                            workers += n
                            workers_pct += pct
                    elif kind == "worker":
                        n, pct = self._worker_cpu(child, now, seen)
                        workers += n
                        workers_pct += pct
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue  # exited between listing and reading
            out["workers"] = workers
            out["workers_cpu_pct"] = workers_pct
            out["children"] = children
        except Exception as exc:
            warn_once("host.children", f"child-process telemetry failed: {exc!r}")
            for key in ("workers", "workers_cpu_pct", "children"):
                reasons[key] = f"children not readable: {exc}"
        # forget processes that are gone so the table does not grow forever
        for gone in [k for k in self._prev if k not in seen]:
            del self._prev[gone]
        try:
            out["host_cpu_pct"] = self._host_pct()
        except Exception as exc:
            warn_once("host.cpu", f"host CPU telemetry failed: {exc!r}")
            reasons["host_cpu_pct"] = f"host CPU not readable: {exc}"
        try:
            vm = psutil.virtual_memory()
            out["host_mem_total"] = int(vm.total)
            out["host_mem_used"] = int(vm.total - vm.available)  # what is not available to others
        except Exception as exc:
            warn_once("host.mem", f"host memory telemetry failed: {exc!r}")
            for key in ("host_mem_used", "host_mem_total"):
                reasons[key] = f"host memory not readable: {exc}"
