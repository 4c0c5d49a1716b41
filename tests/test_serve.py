"""`flowtop serve` and `flowtop snapshot --follow` as a user runs them: real processes, a real
2-rank CPU training under `flowtop run`, real HTTP scrapes parsed with prometheus_client."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from flowtop.tools.demo.launch import free_port_pair, training_command
from snapshot_schema import assert_valid_snapshot

FLOWTOP = [sys.executable, "-m", "flowtop.cli"]


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def _samples(text: str) -> list[Any]:
    return [s for fam in parse_text(text) for s in fam.samples]


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _train(listen: str, steps: int) -> subprocess.Popen[str]:
    cmd = [*FLOWTOP, "run", "--connect", listen, "--", *training_command(2, steps, ["--batch=4", "--seq=64"])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_serve_exports_a_real_training_and_ends_its_series(tmp_path: Path) -> None:
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    http = free_port_pair()
    base = f"http://127.0.0.1:{http}"
    rec = tmp_path / "serve.rec"
    serve = subprocess.Popen([*FLOWTOP, "serve", "--listen", listen, "--prometheus", f"127.0.0.1:{http}",
                              "--prometheus-linger", "3", "--record", str(rec)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    training = None
    try:
        _wait(lambda: _get(base + "/metrics"), 30, "the metrics endpoint")
        training = _train(listen, 80)  # live with an MFU from step ~3: ~5 s of steps left for the scrapes

        def running() -> Any:
            snap = json.loads(_get(base + "/snapshot.json") or "null")
            if not snap or not snap["jobs"]:
                return None
            ranks = snap["jobs"][0]["ranks"]
            return len(ranks) == 2 and all(r["status"] == "live" and r["mfu"] for r in ranks)

        _wait(running, 150, "two live ranks with an MFU")
        # A scrape and the JSON of the same snapshot (its taken_at is in the scrape).
        for _ in range(50):
            text = _get(base + "/metrics") or ""
            snap = json.loads(_get(base + "/snapshot.json") or "null")
            clock = [s.value for s in _samples(text) if s.name == "flowtop_monitor_snapshot_clock_seconds"]
            if clock and snap and clock[0] == snap["taken_at"]:
                break
        else:
            pytest.fail("no scrape matched a snapshot")
        assert_valid_snapshot(snap)
        job = snap["jobs"][0]
        got = _samples(text)
        for r in job["ranks"]:
            labels = {"train_job": job["job"], "rank": str(r["rank"]), "host": r["host"],
                      "local_rank": str(r["local_rank"]), "relay": ""}
            mine = {s.name: s.value for s in got if s.labels == labels}
            assert mine["flowtop_rank_mfu_ratio"] == r["mfu"] and 0 < r["mfu"] < 1
            assert mine["flowtop_rank_model_flops_per_second"] == r["flops_per_s"]
            assert mine["flowtop_rank_peak_flops_per_second"] == r["peak_flops"]
            assert mine["flowtop_rank_step_seconds"] == r["step_time_s"]
            assert mine["flowtop_rank_tokens_per_second"] == r["tokens_per_s"]
            assert mine["flowtop_rank_step_index"] == r["step"]
            assert mine["flowtop_rank_lost_messages_total"] == r["lost_messages"]
            live = [s for s in got if s.name == "flowtop_rank_status" and s.value == 1
                    and s.labels["rank"] == str(r["rank"])]
            assert [s.labels["flowtop_rank_status"] for s in live] == ["live"]
        (mfu,) = [s for s in got if s.name == "flowtop_job_mfu_ratio"]
        assert mfu.labels == {"train_job": job["job"]} and mfu.value == job["mfu"]
        # The job ends: its series stay while it lingers, then go.
        assert training.wait(300) == 0, training.stdout.read()[-3000:] if training.stdout else ""

        def done() -> Any:
            snap = json.loads(_get(base + "/snapshot.json") or "null")
            return snap and snap["jobs"] and snap["jobs"][0]["status"] == "done"

        _wait(done, 20, "the job done")

        def gone() -> Any:
            text = _get(base + "/metrics") or ""
            return text and not [s for s in _samples(text) if s.labels.get("train_job") == job["job"]]

        _wait(gone, 15, "the finished job's series to end")
        serve.send_signal(signal.SIGINT)
        assert serve.wait(20) == 0, serve.stderr.read() if serve.stderr else ""
        assert "metrics at" in (serve.stderr.read() if serve.stderr else "")
        replay = subprocess.run([*FLOWTOP, "snapshot", "--replay", str(rec), "--json"], capture_output=True,
                                text=True, timeout=120)
        assert replay.returncode == 0, replay.stderr
        assert {r["rank"] for r in json.loads(replay.stdout)["jobs"][0]["ranks"]} == {0, 1}
    finally:
        _end(training, serve)


def _end(training: subprocess.Popen[str] | None, *others: subprocess.Popen[str] | None) -> None:
    """Stop what a test left running: ``flowtop run`` by SIGTERM first, which it forwards to
    torchrun and its workers (a SIGKILL of `flowtop run` left them training on for ~25 s, beside
    the tests that came next), then anything still alive by SIGKILL."""
    if training is not None and training.poll() is None:
        training.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            training.wait(30)
    for p in (training, *others):
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_follow_writes_json_lines_until_sigint() -> None:
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    follow = subprocess.Popen([*FLOWTOP, "snapshot", "--follow", "--interval", "0.5", "--listen", listen],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    training = None
    lines: list[str] = []
    try:
        training = _train(listen, 400)
        assert follow.stdout is not None
        while True:
            line = follow.stdout.readline()
            assert line, "follow ended early: " + (follow.stderr.read() if follow.stderr else "")
            lines.append(line)
            snap = json.loads(line)
            if snap["jobs"] and len(snap["jobs"][0]["ranks"]) == 2 and all(
                    r["status"] == "live" and r["step"] > 0 for r in snap["jobs"][0]["ranks"]):
                running = [ln for ln in lines if json.loads(ln)["jobs"]]
                if len(running) >= 3:
                    break
        follow.send_signal(signal.SIGINT)
        rest, err = follow.communicate(timeout=20)
        assert follow.returncode == 0, err
    finally:
        _end(training, follow)
    lines += rest.splitlines(keepends=True)
    assert all(ln.endswith("\n") for ln in lines)  # the last line is whole
    taken = []
    for line in lines:
        snap = json.loads(line)
        assert_valid_snapshot(snap)
        taken.append(snap["taken_at"])
    assert taken == sorted(taken) and len(set(taken)) == len(taken)  # a newer snapshot on every line
    gaps = [b - a for a, b in zip(taken, taken[1:])]
    assert min(gaps) >= 0.45  # one line per interval, not one per tick
    steps = [json.loads(ln)["jobs"][0]["step"] for ln in lines if json.loads(ln)["jobs"]]
    assert steps[-1] > steps[0]  # lines follow a running job


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--prometheus", "nohost"], "expected HOST:PORT"),
        (["serve", "--prometheus", "127.0.0.1:70000"], "expected HOST:PORT"),
        (["top", "--prometheus", "::1:9759"], "IPv6 as [::1]:PORT"),
        (["serve", "--prometheus-max-ranks", "0"], "must be positive"),
        (["snapshot", "--follow", "--interval", "0"], "must be a positive number"),
        (["snapshot", "--follow", "--replay", "x.rec"], "--follow reads a live monitor"),
        (["serve", "--listen", "tcp://0.0.0.0:5999"], "--insecure-bind"),  # beyond loopback: keys first
        # zmq's own words were "Invalid certificate file …/server.key_secret" (a hostile-input trial)
        (["serve", "--curve-dir", "/nonexistent-keys"], "no key directory /nonexistent-keys (create keys with"),
        (["serve", "--curve-dir", "/tmp"], "/tmp holds no server.key_secret: not a monitor's key directory"),
    ],
)
def test_bad_serve_and_follow_arguments(args: list[str], message: str) -> None:
    out = subprocess.run([*FLOWTOP, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr


def test_serve_with_a_busy_metrics_port_exits_2() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([*FLOWTOP, "serve", "--listen", f"tcp://127.0.0.1:{free_port_pair()}",
                              "--prometheus", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60,
                             env={**os.environ})
    assert out.returncode == 2
    assert "cannot serve metrics on 127.0.0.1" in out.stderr and "in use" in out.stderr
