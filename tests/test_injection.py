"""Injection by `flowtop run`: unmodified scripts, chained sitecustomize, exit codes, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(int(sys.argv[1])):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    sys.exit(int(sys.argv[2]))
    """
)


def _flowtop_run(addr: str, *args: str, env: dict[str, str] | None = None, **kw):  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-m", "flowtop.cli", "run", "--connect", addr, "--", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, **kw)


def test_unmodified_script_is_probed(monitor, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert "probe" not in SCRIPT
    proc = _flowtop_run(monitor.listen, sys.executable, str(script), "12", "0")
    assert proc.returncode == 0, proc.stderr
    snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].status == "done", 10)
    rank = snap.jobs[0].ranks[0]
    assert rank.step == 12
    assert rank.tokens_per_step is None and rank.tokens_per_s is None  # no embedding: tokens are not guessed


def test_exit_code_and_existing_sitecustomize_chained(monitor, tmp_path: Path) -> None:
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    marker = tmp_path / "marker.txt"
    (user_site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(user_site))
    proc = _flowtop_run(monitor.listen, sys.executable, str(script), "3", "7", env=env)
    assert proc.returncode == 7
    assert marker.read_text() == "ran"
    snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == 3, 10)
    assert snap.jobs[0].ranks[0].step == 3


def test_a_users_sitecustomize_stays_alive_with_what_it_registered(monitor, tmp_path: Path) -> None:
    # torch.library registrations live as long as the Library object in the module's globals:
    # flowtop run used to drop the user's module right after importing it (ops gone, imports
    # such as transformers then failing only under flowtop).
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(textwrap.dedent("""
        import torch
        LIB = torch.library.Library("flowtop_user", "DEF")
        LIB.define("twice(Tensor x) -> Tensor")
        LIB.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
        MARK = "user"
    """))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import gc, sys, torch
        gc.collect()
        import sitecustomize
        assert sitecustomize.MARK == "user", sitecustomize
        assert torch.ops.flowtop_user.twice(torch.ones(2)).tolist() == [2.0, 2.0]
        assert "_flowtop_sitecustomize" in sys.modules
    """) + SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(user_site))
    proc = _flowtop_run(monitor.listen, sys.executable, str(script), "3", "0", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == 3, 10)
    assert snap.jobs[0].ranks[0].step == 3  # and the probe still attached


def test_broken_sitecustomize_environment_never_breaks_training(tmp_path: Path) -> None:
    # An unusable address in the environment flowtop run gives its command (flowtop run itself
    # refuses it, see tests/test_cli.py; a launcher's own environment may still carry one): the
    # guest must swallow it and training must succeed.
    from flowtop.tools.runner import probe_env

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), "3", "0"], capture_output=True, text=True, timeout=120,
                          env=probe_env(os.environ, "not-an-address"))
    assert proc.returncode == 0, proc.stderr
    assert "ignoring FLOWTOP_ADDR" in proc.stderr
    assert "the probe stays off" in proc.stderr  # nothing sent to the default port, where another monitor may listen


def test_missing_command_is_a_clear_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "flowtop.cli", "run"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no command given" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "flowtop.cli", "run", "--", "/nonexistent/cmd"], capture_output=True, text=True
    )
    assert proc.returncode == 127
    assert "cannot start" in proc.stderr


def test_signals_are_forwarded(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    out = tmp_path / "got.txt"
    script.write_text(
        "import signal, sys, time\n"
        f"def h(s, f):\n    open({str(out)!r}, 'w').write(str(s)); sys.exit(5)\n"
        "signal.signal(signal.SIGTERM, h)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtop.cli", "run", "--", sys.executable, str(script)],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 5
    assert out.read_text() == str(int(signal.SIGTERM))
