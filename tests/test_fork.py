"""DataLoader workers fork the rank: they must stay silent and nothing may hang."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, sys.argv[1])
    import probe
    assert probe.attach(addr=sys.argv[2])

    class Data(torch.utils.data.Dataset):
        def __len__(self): return 64
        def __getitem__(self, i):
            import probe as p
            assert not p.is_attached(), "probe active in a worker"
            return torch.randn(8), torch.randn(1)

    if __name__ == "__main__":
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(Data(), batch_size=8, num_workers=2,
                                             multiprocessing_context="fork")
        for epoch in range(2):
            for x, y in loader:
                (model(x) - y).pow(2).mean().backward()
                opt.step(); opt.zero_grad()
        print("ok")
    """
)


def test_forked_workers_send_nothing_and_nothing_hangs(monitor, tmp_path) -> None:
    script = tmp_path / "fork_train.py"
    script.write_text(SCRIPT)
    root = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, str(script), root, monitor.listen], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].status == "done", 10)
    pids = {r.pid for j in snap.jobs for r in j.ranks}
    assert len(pids) == 1  # only the training process itself ever spoke
    assert snap.jobs[0].ranks[0].step == 16
