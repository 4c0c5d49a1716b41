"""Run a recipe from recipes/ unmodified under `flowtop run` into a real collector, and hand counts.

The hand counts here are written out from the model's config (never from flowtop's output):
see the docstrings and README "Frameworks".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
#: A recipe prints one line ``FRAMEWORK_METRICS {json}`` with the framework's own figures.
METRICS_TAG = "FRAMEWORK_METRICS "


@dataclass
class RecipeRun:
    proc: subprocess.CompletedProcess[str]
    snap: MonitorSnapshot
    data: dict[str, Any]  # the JSON snapshot (flowtop snapshot --json)

    @property
    def job(self) -> dict[str, Any]:
        assert len(self.data["jobs"]) == 1, [j["job"] for j in self.data["jobs"]]
        return self.data["jobs"][0]

    @property
    def ranks(self) -> list[dict[str, Any]]:
        return sorted(self.job["ranks"], key=lambda r: (r["rank"], r["pid"]))

    def framework_metrics(self) -> dict[str, Any]:
        """Merged ``FRAMEWORK_METRICS`` lines the recipe printed (rank 0's, usually)."""
        out: dict[str, Any] = {}
        for line in self.proc.stdout.splitlines():
            if line.startswith(METRICS_TAG):
                out.update(json.loads(line[len(METRICS_TAG):]))
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_recipe(monitor: Any, argv: list[str], n_ranks: int, timeout: float = 150.0,
               env: dict[str, str] | None = None) -> RecipeRun:
    """``python -m flowtop.cli run --connect <monitor> -- *argv`` (cwd: the repo root), then wait
    until ``n_ranks`` processes said bye; return the final snapshot and its JSON form."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")  # two ranks on a 2-core CI machine
    e.update({"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "HF_DATASETS_OFFLINE": "1", "WANDB_DISABLED": "true", "PYTHONUNBUFFERED": "1"})
    e.update(env or {})
    cmd = [sys.executable, "-m", "flowtop.cli", "run", "--connect", monitor.listen, "--", *argv]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=e)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    def finished(s: MonitorSnapshot) -> bool:
        ranks = [r for j in s.jobs for r in j.ranks]
        return len(ranks) >= n_ranks and all(r.status == "done" for r in ranks)

    snap = monitor.wait_for(finished, timeout=15)
    data = to_json(snap)
    validate_snapshot(data)
    print(f"{argv[-1] if argv else ''}: {time.monotonic() - t0:.1f} s")
    return RecipeRun(proc, snap, data)


def validate_snapshot(data: dict[str, Any]) -> None:
    """The JSON Schema check, where the test suite has one (issue 13: schema shipped with the package)."""
    try:
        from snapshot_schema import assert_valid_snapshot  # type: ignore[import-not-found]
    except ImportError:
        assert data["schema"].startswith("flowtop.snapshot/1")
        return
    assert_valid_snapshot(data)


# ---------------------------------------------------------------------------------------------
# Hand counts (flowtop's conventions: README "FLOP conventions", docs/formulas.md)
#
# matmul (M×K)(K×N) = 2·M·N·K.  Per token, a linear layer with a K×N weight costs 2·K·N forward;
# attention (QKᵀ and AV) costs 2·T·d each per token per layer, i.e. 4·T·d per layer, with the
# *full* square (flowtop's default convention: an `is_causal` SDPA call is not halved).
# Training = 3 × forward (backward = input gradients + weight gradients, 2 × forward each matmul,
# attention backward = 2 × its forward).  Norms, activations, softmax, the loss and the optimizer
# are not matmuls and are not counted; embedding lookups are not matmuls either, but a tied LM
# head is (it is a d×V matmul whatever its weight is shared with).
# ---------------------------------------------------------------------------------------------


def decoder_train_flops_per_token(linear_weights: int, n_layer: int, d_attn: int, seq: int) -> int:
    """3 × (2 · Σ linear weight elements + n_layer · 4 · T · d_attn), d_attn = query heads × head dim."""
    return 3 * (2 * linear_weights + n_layer * 4 * seq * d_attn)


def gpt2_linear_weights(d: int, n_layer: int, vocab: int, d_ff: int | None = None) -> int:
    """GPT-2 layout (tiny_gpt.TinyGPT, HF GPT2LMHeadModel): per layer QKV d×3d, attention out d×d,
    MLP d×d_ff and d_ff×d (d_ff = 4d), so 12·d² per layer; plus the LM head d×V."""
    f = 4 * d if d_ff is None else d_ff
    return n_layer * (d * 3 * d + d * d + 2 * d * f) + d * vocab


def llama_linear_weights(d: int, n_layer: int, vocab: int, n_head: int, n_kv_head: int, d_ff: int) -> int:
    """LLaMA layout: q d×d, k and v d×(d·kv/heads) (GQA), o d×d, SwiGLU gate and up d×ffn,
    down ffn×d; plus an untied LM head d×V."""
    kv = d * n_kv_head // n_head
    return n_layer * (2 * d * d + 2 * d * kv + 3 * d * d_ff) + d * vocab


def assert_rank_basics(r: dict[str, Any], *, steps: int, tokens_per_step: int, flops_per_step: int,
                       allowed_uncounted: frozenset[str] = frozenset()) -> None:
    """What every recipe pins per rank: steps, tokens, FLOPs against the hand count, tokens/s, MFU."""
    assert r["status"] == "done" and r["bye_reason"] == "exit", r
    assert r["step"] == steps
    assert r["tokens_per_step"] == tokens_per_step
    assert r["attention_convention"] == "full"
    assert r["counted"] is True
    assert set(r["uncounted_ops"]) <= allowed_uncounted, r["uncounted_ops"]
    assert r["flops_per_step"] == flops_per_step, (r["flops_per_step"], flops_per_step,
                                                   r["flops_per_step"] / flops_per_step)
    assert r["flops_per_token"] == flops_per_step / tokens_per_step
    assert r["tokens_per_s"] is not None and r["tokens_per_s"] > 0
    assert r["mfu"] is not None and 0 < r["mfu"] < 1, (r["mfu"], r["mfu_reason"])
    assert r["peak_flops"] and r["peak_source"].startswith("estimated")  # the CPU peak table
    assert r["dtype"] == "fp32"
