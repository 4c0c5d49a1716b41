"""Probe configuration and job identity from the environment."""

from __future__ import annotations

import socket

import pytest

from probe import config, identity, wire
from probe.wire import DEFAULT_ADDR


def test_defaults() -> None:
    cfg = config.from_env({})
    assert cfg.enabled and cfg.addr == DEFAULT_ADDR
    assert (cfg.flops, cfg.kernels, cfg.telemetry, cfg.attention) == (True, True, True, "full")


def test_values() -> None:
    cfg = config.from_env({
        "FLOWTOP_ADDR": "tcp://10.0.0.5:7000", "FLOWTOP_ATTENTION": "causal", "FLOWTOP_QUEUE": "50",
        "FLOWTOP_FLOPS": "off", "FLOWTOP_DISABLE": "no", "FLOWTOP_TELEMETRY_INTERVAL": "0.1",
        "FLOWTOP_KERNELS_MIN_STEPS": "25", "FLOWTOP_FLOPS_PER_TOKEN": "1.5e9",
    })  # fmt: skip
    assert cfg.addr == "tcp://10.0.0.5:7000"
    assert (cfg.attention, cfg.queue_size, cfg.flops, cfg.enabled) == ("causal", 50, False, True)
    assert cfg.telemetry_interval_s == 1.0  # at most 1 Hz, whatever is asked
    assert cfg.kernels_min_steps == 25 and cfg.flops_per_token == 1.5e9


@pytest.mark.parametrize(
    ("name", "value", "field", "default"),
    [
        ("FLOWTOP_ATTENTION", "half", "attention", "full"),
        ("FLOWTOP_QUEUE", "-3", "queue_size", 10_000),
        ("FLOWTOP_FLOPS", "maybe", "flops", True),
        ("FLOWTOP_ADDR", "localhost:1", "addr", DEFAULT_ADDR),
        ("FLOWTOP_FLOPS_PER_TOKEN", "nan", "flops_per_token", None),
    ],
)
def test_bad_values_fall_back_and_warn(name: str, value: str, field: str, default: object, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = config.from_env({name: value})
    assert getattr(cfg, field) == default
    assert f"ignoring {name}={value!r}" in capsys.readouterr().err
    # An unusable monitor address turns the probe off instead (nothing sent to a monitor nobody named).
    assert cfg.enabled is (name != "FLOWTOP_ADDR")


def test_identity_from_torchrun() -> None:
    ident = identity.from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "abc",
                               "TORCHELASTIC_RESTART_COUNT": "2"})  # fmt: skip
    assert (ident.job, ident.rank, ident.local_rank, ident.world_size, ident.incarnation) == ("abc", 3, 1, 8, 2)
    assert ident.key.job == "abc" and ident.host == socket.gethostname()


def test_identity_fallbacks_and_explicit() -> None:
    assert identity.from_env({"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}).job == "n1:29500"
    solo = identity.from_env({})
    assert solo.job == f"{solo.host}:{solo.pid}" and (solo.rank, solo.world_size) == (0, 1)
    explicit = identity.from_env({"RANK": "1", "WORLD_SIZE": "2"}, job="mine", rank=5)
    assert (explicit.job, explicit.rank, explicit.world_size) == ("mine", 5, 6)  # world grows to fit the rank
    assert identity.from_env({"RANK": "x", "WORLD_SIZE": "-2"}).rank == 0


def test_a_queue_past_a_deques_size_falls_back(capsys) -> None:  # type: ignore[no-untyped-def]
    """FLOWTOP_QUEUE=99999999999999999999 turned the whole probe off ("probe disabled:
    OverflowError: Python int too large to convert to C ssize_t", the variable unnamed; a
    hostile-input trial): it is refused like any bad value, naming it."""
    from probe import _log

    _log._seen.discard("env:FLOWTOP_QUEUE")  # said once per process: the cases above said it
    cfg = config.from_env({"FLOWTOP_QUEUE": "99999999999999999999"})
    assert cfg.queue_size == 10_000
    assert "ignoring FLOWTOP_QUEUE='99999999999999999999': must be at most 10,000,000" in capsys.readouterr().err


def test_a_job_id_with_control_characters_is_not_used() -> None:
    """Every frame of a job id with a tab or an escape is refused by the monitor (the wire's
    envelope check): the whole training was invisible and nothing said why (a hostile-input
    trial). FLOWTOP_JOB with one is said and ignored (the launcher's id is used); an explicit
    job argument is made printable; an empty one is no id."""
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        ident = identity.from_env({"FLOWTOP_JOB": "exp\t1", "TORCHELASTIC_RUN_ID": "abc"})
    assert ident.job == "abc"
    assert "FLOWTOP_JOB" in err.getvalue() and "control characters" in err.getvalue()
    assert identity.from_env({}, job="exp\x1b[31m1").job == "exp?[31m1"
    solo = identity.from_env({}, job=" ")
    assert solo.job == f"{solo.host}:{solo.pid}"
    # an empty one is no id: the launcher's names the job, not every process its own (a review)
    assert identity.from_env({"TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "WORLD_SIZE": "2"}, job="").job == "abc"
    for job in ("exp\t1", "", " "):
        assert wire.job_id_problem(job)
    assert wire.job_id_problem("exp-1 (bf16)") == "" and wire.job_id_problem("x" * 300) == ""
    assert identity.from_env({"FLOWTOP_JOB": "x" * 300}).job == "x" * 256  # cut, as before


def test_identity_from_slurm_and_mpi() -> None:
    slurm = identity.from_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                               "SLURM_JOB_ID": "777", "SLURM_STEP_ID": "2"})  # fmt: skip
    assert (slurm.job, slurm.rank, slurm.world_size, slurm.local_rank) == ("slurm-777.2", 5, 16, 1)
    mpi = identity.from_env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
                             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "MASTER_ADDR": "n1", "MASTER_PORT": "1"})  # fmt: skip
    assert (mpi.job, mpi.rank, mpi.world_size) == ("n1:1", 2, 4)
    # torchrun's variables win over the launcher's when both are present.
    both = identity.from_env({"RANK": "1", "SLURM_PROCID": "9", "WORLD_SIZE": "2", "SLURM_NTASKS": "10"})
    assert (both.rank, both.world_size) == (1, 2)


def test_recheck_zero_turns_rechecks_off() -> None:
    assert config.from_env({"FLOWTOP_RECHECK_STEPS": "0"}).recheck_steps == 0


def test_a_flush_interval_above_ten_seconds_is_capped_and_said(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from probe import _log

    monkeypatch.setattr(_log, "_seen", set())  # said once per process: this test's process may have said it
    assert config.from_env({"FLOWTOP_FLUSH_S": "100"}).flush_s == config.MAX_FLUSH_S == 10.0
    assert "FLOWTOP_FLUSH_S=100 is above 10 s; using 10" in capsys.readouterr().err
    assert config.from_env({"FLOWTOP_FLUSH_S": "2.5"}).flush_s == 2.5


def test_a_telemetry_interval_below_a_second_is_raised_and_said(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The README: a bad value is reported once and a usable one taken; 0.5 s was raised to 1 s
    without a word (found by a new-user trial)."""
    from probe import _log

    monkeypatch.setattr(_log, "_seen", set())
    assert config.from_env({"FLOWTOP_TELEMETRY_INTERVAL": "0.5"}).telemetry_interval_s == 1.0
    assert "FLOWTOP_TELEMETRY_INTERVAL=0.5 is below 1 s; using 1" in capsys.readouterr().err
    assert config.from_env({"FLOWTOP_TELEMETRY_INTERVAL": "2.5"}).telemetry_interval_s == 2.5
    assert capsys.readouterr().err == ""


def test_flowtop_host_names_the_node() -> None:
    """README "Several nodes on one machine": FLOWTOP_HOST is the host a rank reports (its node),
    read in one place (probe.config.host_name) by the probe and the node relay."""
    assert identity.from_env({"FLOWTOP_HOST": "node-b"}).host == "node-b"
    assert identity.from_env({"FLOWTOP_HOST": ""}).host == socket.gethostname()
    assert config.host_name({"FLOWTOP_HOST": " node-c "}) == "node-c"
    assert config.host_name({}) == socket.gethostname()
    from flowtop import settings

    # the relay reads it as flowtop's setting, the same variable and the same check
    assert settings.HOST.name == config.HOST.name
    assert settings.HOST.read({"FLOWTOP_HOST": "node-d"}) == "node-d" and settings.HOST.read({}) is None
