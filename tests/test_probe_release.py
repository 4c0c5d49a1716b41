"""The probe never keeps the user's model alive once it has detached.

Found by CI: the probe's step tracker held the DDP-wrapped model after ``detach("exit")``, so
the model's gloo reducer and its pending work were destroyed during interpreter finalization,
and about one gloo training in a few hundred died of SIGABRT ("terminate called without an
active exception") after it had finished. A user who trains several models in one process
(a sweep) would also keep every finished model's memory.
"""

from __future__ import annotations

import gc
import socket
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import probe
import step_spy

torch = pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train])")
dist = pytest.importorskip("torch.distributed", reason="the DDP tests need torch.distributed (gloo)")
nn = torch.nn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(model: Any, steps: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(0, 64, (2, 8))
        model(idx).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()


def _lm(width: int = 16) -> Any:
    return nn.Sequential(nn.Embedding(64, width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 64))


@pytest.fixture
def probe_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setenv("FLOWTOP_ADDR", "tcp://127.0.0.1:1")  # nobody listens
    monkeypatch.setenv("FLOWTOP_KERNELS_MIN_STEPS", "4")
    # Freed by reference counts alone, as at the end of a script: a collection that happened to
    # run mid-test must not hide a reference cycle through the probe.
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _trained_ddp() -> tuple[Any, Any]:
    """A DDP model trained under the probe, as weak references (model, reducer, process group): the frame that
    held it has ended, as the demo's main() has when the probe detaches at exit."""
    model = torch.nn.parallel.DistributedDataParallel(_lm())
    _train(model, 12)  # past the FLOP count (step 2) and the layout scan
    hooked = probe._current().tracker.root is model
    assert hooked  # the probe did find and hook it
    return weakref.ref(model), weakref.ref(model.reducer), weakref.ref(model.process_group)


def test_a_detached_probe_frees_the_ddp_model_and_its_reducer(probe_env: None) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        assert probe.attach(job="release")
        model, reducer, _ = _trained_ddp()
        probe.detach()
        assert model() is None and reducer() is None
    finally:
        probe.detach()
        dist.destroy_process_group()


def _trial(width: int, steps: int) -> Any:
    model = _lm(width)
    _train(model, steps)
    hooked = probe._current().tracker.root is model
    assert hooked
    return weakref.ref(model)


def _hand_flops(width: int) -> int:
    # Per step, B×S = 2×8 tokens through Linear w→w and Linear w→64, forward 2·B·S·(w² + 64·w),
    # backward twice that (the embedding's table is trained, so its output needs a gradient).
    return 3 * 2 * 2 * 8 * (width * width + 64 * width)


def test_a_sweep_frees_each_trial_and_counts_the_next_one_afresh(probe_env: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Trials in one process (Optuna, a Trainer's hyperparameter search): each trial's model is
    # freed when the user drops it though the probe stays attached, and the next trial's model,
    # with the same input shapes, is found and counted as itself, not given the last one's count.
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "1000")  # count every new shape on these tiny steps
    assert probe.attach(job="sweep")
    out: list[tuple[str, dict[str, Any]]] = []
    p = probe._current()
    step_spy.spy(p, out)
    try:
        first = _trial(16, 8)
        assert first() is None
        second = _trial(32, 6)
        assert second() is None
        steps = [f["step"] for k, f in out if k == "step"]
        assert steps == list(range(1, 15))
        counts = [(f["step"], f["model_flops"]) for k, f in out if k == "flops"]
        assert _hand_flops(16) == 122_880 and _hand_flops(32) == 294_912
        # Trial 2 starts at step 9: its optimizer step tells the probe the last model is gone, its
        # model is found at step 10's forward and counted at the next step, as at steps 1 and 2.
        assert counts == [(2, 122_880), (11, 294_912)]
        # Step 9's forward ran before the probe looked for a model again: its tokens are unknown.
        assert [f["tokens"] for k, f in out if k == "step"] == [16] * 8 + [0] + [16] * 5
    finally:
        probe.detach()


def test_a_probe_detached_before_any_step_frees_the_model(probe_env: None) -> None:
    # A rank that dies before its first optimizer step: the layout scan of its first forward met
    # the DDP wrapper, and no boundary ever came to drop what it found.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        assert probe.attach(job="early")

        def forward_only() -> Any:
            model = torch.nn.parallel.DistributedDataParallel(_lm())
            model(torch.randint(0, 64, (2, 8))).sum().backward()
            wrappers = probe._current()._found.wrappers
            assert wrappers and wrappers[0] is model  # the scan did find it
            return weakref.ref(model)

        model = forward_only()
        probe.detach()
        assert model() is None
    finally:
        probe.detach()
        dist.destroy_process_group()


def test_the_group_of_a_ddp_wrapped_part_of_the_model_is_kept(probe_env: None) -> None:
    # A part of the model trained over a group of its own: neither the root nor on the first
    # forward's stack when the layout scan runs, its wrapper's group is kept all the same (see
    # probe.steps.keepgroups.keep_groups: its destructor must not run wherever the model is freed).
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        assert probe.attach(job="nested")

        def trial() -> tuple[Any, Any]:
            group = dist.new_group([0])
            # (not a local: the scan meets the wrappers held in the frames' variables)
            model = nn.Sequential(nn.Embedding(64, 16),
                                  torch.nn.parallel.DistributedDataParallel(nn.Linear(16, 16), process_group=group),
                                  nn.GELU(), nn.Linear(16, 64))
            _train(model, 12)  # past the layout scan
            assert probe._current().tracker.root is model
            dist.destroy_process_group(group)  # the user lets go of it: only the model held it
            return weakref.ref(model), weakref.ref(group)

        model, group = trial()
        probe.detach()
        assert model() is None  # the model is not kept
        assert group() is not None  # its part's group is
    finally:
        probe.detach()
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")  # one rank: its groups are what counts
def test_both_groups_of_a_hybrid_sharded_fsdp_model_are_kept(probe_env: None) -> None:
    # FSDP1's hybrid sharding holds two groups: the shard group (process_group) and the replicas'
    # (_inter_node_pg); the destructor of either must not run where the model is freed.
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        assert probe.attach(job="hybrid")

        def trial() -> tuple[Any, Any, Any]:
            intra, inter = dist.new_group([0]), dist.new_group([0])
            model = FullyShardedDataParallel(_lm(), device_id=torch.device("cpu"), process_group=(intra, inter),
                                             sharding_strategy=ShardingStrategy.HYBRID_SHARD)
            assert model._inter_node_pg is inter
            _train(model, 12)  # past the layout scan
            assert probe._current().tracker.root is model
            dist.destroy_process_group(intra)
            dist.destroy_process_group(inter)
            return weakref.ref(model), weakref.ref(intra), weakref.ref(inter)

        model, intra, inter = trial()
        probe.detach()
        gc.collect()  # FSDP1 holds itself through reference cycles (its state handles): not the probe's
        assert model() is None
        assert intra() is not None and inter() is not None
    finally:
        probe.detach()
        dist.destroy_process_group()


class _Wrapper(nn.Module):
    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, idx: Any) -> Any:
        return self.inner(idx)


def test_a_wrapped_compiled_model_then_a_plain_one_is_found(probe_env: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Discovery ends inside the wrapper's forward (at the compiled module): the wrapper's
    # post-hook never runs, and a depth left at 1 hid every later model from discovery.
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    assert probe.attach(job="wrapped")
    p = probe._current()
    try:
        def compiled_trial() -> None:
            inner = _lm()
            _train(_Wrapper(torch.compile(inner, backend="eager")), 4)

        compiled_trial()
        assert p.tracker.root is None and p.tracker.compiled  # the compiled module was dropped
        second = _trial(16, 4)
        assert second() is None  # found (_trial asserts the probe hooked it), then freed
    finally:
        probe.detach()


def test_moe_layers_do_not_outlive_their_model(probe_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from moe_helpers import MoE

    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "1000")
    assert probe.attach(job="moe")
    try:
        def trial() -> tuple[Any, Any]:
            model = nn.Sequential(nn.Linear(16, 16), MoE(16, 24, 4, 2))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for _ in range(6):  # past the count at step 2, whose window found the MoE layer
                model(torch.randn(8, 16)).square().mean().backward()
                opt.step()
                opt.zero_grad()
            return weakref.ref(model), weakref.ref(model[1].experts)

        model, experts = trial()
        assert model() is None and experts() is None
    finally:
        probe.detach()


def test_a_detached_probe_is_not_kept_by_its_sigterm_handler(probe_env: None) -> None:
    # The SIGTERM handler outlives a detach (it still kills as before); it must not keep the
    # probe, and with it whatever the probe last knew of the training, alive.
    assert probe.attach(job="bye")
    p = weakref.ref(probe._current())
    _train(_lm(), 3)
    probe.detach()
    gc.collect()  # the probe's own parts refer to each other
    assert p() is None


def test_inference_after_a_dropped_model_stops_paying_for_discovery(probe_env: None) -> None:
    # The trained model is dropped (its root lost), an optimizer steps once with no forward (a
    # checkpoint restore), then the process only runs inference: discovery's global hooks on
    # every module's forward are dropped after 10,000 idle calls, as in a process that never trained.
    assert probe.attach(job="infer")
    p = probe._current()
    try:
        _train(_lm(), 3)
        w = nn.Parameter(torch.zeros(2))
        w.grad = torch.ones(2)
        torch.optim.SGD([w], lr=0.1).step()  # rediscovery starts here
        assert p.tracker._global_handles
        model = nn.Linear(4, 4)
        with torch.no_grad():
            for _ in range(10_050):
                model(torch.zeros(1, 4))
        assert not p.tracker._global_handles
    finally:
        probe.detach()
