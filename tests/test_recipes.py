"""Issue 13: every recipe in recipes/ runs unmodified under `flowtop run` into a real collector,
and flowtop's figures match hand counts derived here from the model's config.

Hand counts: tests/recipe_helpers.py (formulas written out there and in README "Frameworks").
Framework packages (transformers, accelerate, lightning) are the `frameworks` extra; the tests that
need them are skipped without it (`.ci/run` installs it).
"""

from __future__ import annotations

import sys

import pytest

from recipe_helpers import (
    RECIPES,
    assert_rank_basics,
    decoder_train_flops_per_token,
    free_port,
    gpt2_linear_weights,
    llama_linear_weights,
    run_recipe,
)

# recipes/tiny_gpt.Config defaults: the shape every plain-torch recipe trains.
TINY = dict(vocab=512, n_layer=2, d=64, seq=32)


def tiny_gpt_flops_per_token() -> int:
    """TinyGPT: 3 × (2·(L·12d² + d·V) + L·4·T·d) = 3 × (2·(2·12·64² + 64·512) + 2·4·32·64) = 835,584."""
    t = TINY
    linear = gpt2_linear_weights(t["d"], t["n_layer"], t["vocab"])
    assert linear == 2 * 12 * 64 * 64 + 64 * 512 == 131_072
    fpt = decoder_train_flops_per_token(linear, t["n_layer"], t["d"], t["seq"])
    assert fpt == 835_584
    return fpt


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]


def assert_ranks(run, n: int) -> None:
    job = run.job
    assert job["world_size"] == n and job["ranks_seen"] == n
    assert [r["rank"] for r in run.ranks] == list(range(n))
    assert len({r["pid"] for r in run.ranks}) == n


def assert_job_sums(run) -> None:
    job, ranks = run.job, run.ranks
    assert job["tokens_per_s"] == pytest.approx(sum(r["tokens_per_s"] for r in ranks))
    assert job["flops_per_s"] == pytest.approx(sum(r["flops_per_s"] for r in ranks))
    assert job["mfu"] is not None and job["mfu"] > 0


# ---------------------------------------------------------------------------------------------- plain torch


def test_plain_loop_with_probe_attach(monitor) -> None:
    steps, batch = 20, 4
    run = run_recipe(monitor, [sys.executable, str(RECIPES / "plain_loop.py"), f"--steps={steps}",
                               f"--batch={batch}"], n_ranks=1)
    assert_ranks(run, 1)
    tokens = batch * TINY["seq"]
    assert_rank_basics(run.ranks[0], steps=steps, tokens_per_step=tokens,
                       flops_per_step=tiny_gpt_flops_per_token() * tokens)  # 106,954,752


def test_torchrun_ddp(monitor) -> None:
    steps, batch = 20, 4
    run = run_recipe(monitor, torchrun(str(RECIPES / "torchrun_ddp.py"), f"--steps={steps}", f"--batch={batch}"),
                     n_ranks=2)
    assert_ranks(run, 2)
    tokens = batch * TINY["seq"]  # per rank: DDP ranks each train their own batch
    for r in run.ranks:
        assert_rank_basics(r, steps=steps, tokens_per_step=tokens, flops_per_step=tiny_gpt_flops_per_token() * tokens)
    assert_job_sums(run)


def test_fsdp2(monitor) -> None:
    steps, batch = 20, 4
    run = run_recipe(monitor, torchrun(str(RECIPES / "fsdp2.py"), f"--steps={steps}", f"--batch={batch}"),
                     n_ranks=2)
    assert_ranks(run, 2)
    tokens = batch * TINY["seq"]
    # FSDP computes on the all-gathered (full) weights: each rank does the whole model's FLOPs
    # for its own batch, exactly as DDP does.
    for r in run.ranks:
        assert_rank_basics(r, steps=steps, tokens_per_step=tokens, flops_per_step=tiny_gpt_flops_per_token() * tokens)
    assert_job_sums(run)


def test_mp_spawn_without_rank_env(monitor) -> None:
    steps, batch = 20, 4
    run = run_recipe(monitor, [sys.executable, str(RECIPES / "mp_spawn.py"), f"--steps={steps}", f"--batch={batch}"],
                     n_ranks=2, env={"MASTER_PORT": str(free_port())})
    assert_ranks(run, 2)
    tokens = batch * TINY["seq"]
    for r in run.ranks:
        assert_rank_basics(r, steps=steps, tokens_per_step=tokens, flops_per_step=tiny_gpt_flops_per_token() * tokens)
    assert_job_sums(run)
