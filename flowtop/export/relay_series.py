"""The node relays' series (``flowtop_relay_*``) and the ``relay`` label a rank shares with its relay. No Textual.

A relay is a process (id ``host:pid:nonce``, flowtop.monitor.relays) serving the ranks that connect
to its address on its host (``listen``, in its reports). Its series follow the address, not the
process: a relay that takes a node's socket over once its predecessor died or ended (another
``flowtop run`` of the node, or ``flowtop relay`` started again on its ``--listen``) binds the same
address and goes on with its predecessor's series, the most recently heard relay of an address being the
one exported; the dead one, still listed by the monitor for FORGET_AFTER_S, leaves no second series
behind. Two relays running at once on one host do not share an address (a lock holds an ipc path, a
port takes one bind): two users' ``flowtop run``, two monitors or key directories, a ``flowtop
relay --listen`` of its own. Each is a series of its own (until 2026-12-07 the exporter kept one
series per host, the most recently heard relay there, and hid the others). Where /tmp is private
to each job (Slurm's job_container/tmpfs) or two containers share a host name, two relays can
share an address string: those are still one series, the most recently heard. The text report's
"replaced by a newer relay" (flowtop.export.textreport.replaced_relays) is the same notion.

The label: ``relay="HOST"`` while a host's listed relays are all on one address, as for every host
but a rare one (the label and the number of series as before: an address on every rank series was
~70 bytes × ~20 families × 1,024 ranks more per scrape); ``relay="HOST ADDRESS"`` for each relay of
a host with relays on several addresses that are live or have ranks behind them (its series
renamed when a second such address appears on its host, and back once the other ends with no
rank behind it). A rank behind a relay the monitor does not list (refused at its relay limit)
carries its host alone: on a host of several addresses no relay series has that label. A rank carries its
relay's label, so ``on (relay)`` joins a rank's series to its relay's.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from flowtop.export.families import Families, state_set
from flowtop.monitor.snapshot import RelaySnapshot

RELAY_STATES = ("live", "silent", "closed")


def relay_labels(relays: Sequence[RelaySnapshot]) -> dict[str, str]:
    """Relay id -> its ``relay`` label, for every relay listed (see the module docstring)."""
    by_host: dict[str, list[RelaySnapshot]] = {}
    for rel in relays:
        by_host.setdefault(rel.host, []).append(rel)
    out = {}
    for host, rels in by_host.items():
        # A relay that ended with no rank behind it is no address of the host's any more: the
        # job before on another socket path (another XDG_RUNTIME_DIR, monitor address spelling)
        # renamed every series of the node's next job 10 minutes in, when the monitor forgot it.
        several = len({r.listen for r in rels if r.listen and (r.status == "live" or r.ranks)}) > 1
        for rel in rels:
            address = _address(rel, rels) if several else ""
            out[rel.relay] = f"{host} {address}" if address else host
    return out


def _address(rel: RelaySnapshot, rels: list[RelaySnapshot]) -> str:
    """``rel``'s address; before its first report (a second after it starts, up to 5 s after the
    monitor's) that of its host's most recently heard relay that is no longer live, whose address
    a restarted relay binds (a rank's series must not take a label for that second alone); ""
    where there is none (a live relay's address is not the new one's: it holds its lock)."""
    if rel.listen:
        return rel.listen
    gone = [r for r in rels if r.listen and r.status != "live"]
    return (min(gone, key=lambda r: r.age_s).listen or "") if gone else ""


def _newer(rel: RelaySnapshot, old: RelaySnapshot) -> bool:
    """Whether ``rel`` rather than ``old`` (same label) is exported: the more recently heard, but
    a relay that has not reported its address yet never hides a live one that has (it is not that
    relay's successor: a live relay still holds its address) — unless every rank behind that one
    now comes through it: the live one died, not silent for SILENT_AFTER_S yet, and this is its
    successor (the series showed the dead relay's last report, its frames and "live", for those
    seconds, while its ranks' frames came through the new one)."""
    if _holds(old, rel):
        return False
    if _holds(rel, old):  # the same rule whichever of the two the walk met first (ids sort as text)
        return True
    return rel.age_s < old.age_s


def _holds(live: RelaySnapshot, other: RelaySnapshot) -> bool:
    """Whether ``live`` (reported its address, live) keeps the label from ``other`` (not reported
    yet): unless every rank behind ``live`` now comes through ``other`` (see :func:`_newer`)."""
    return bool(live.listen) and not other.listen and live.status == "live" and not (other.ranks and not live.ranks)


def rank_relay_label(relay_id: str | None, labels: Mapping[str, str]) -> str:
    """A rank's ``relay`` label: its relay's (``labels``: :func:`relay_labels`), "" when it
    connects directly, the host in the id (``host:pid:nonce``) for a relay the monitor does not list
    (refused at its relay limit)."""
    if not relay_id:
        return ""
    label = labels.get(relay_id)
    if label is not None:
        return label
    host = relay_id.rpartition(":")[0].rpartition(":")[0]
    return host or relay_id


def add_relays(fam: Families, relays: Sequence[RelaySnapshot], labels: Mapping[str, str]) -> None:
    """One series set per ``relay`` label: the most recently heard relay with that label."""
    newest: dict[str, RelaySnapshot] = {}
    for rel in relays:
        old = newest.get(labels[rel.relay])
        if old is None or _newer(rel, old):
            newest[labels[rel.relay]] = rel
    for label in sorted(newest):
        rel, key = newest[label], [label]
        fam.states("flowtop_relay_status").add_metric(key, state_set(rel.status, RELAY_STATES))
        fam.gauge("flowtop_relay_ranks").add_metric(key, rel.ranks)
        fam.counter("flowtop_relay_frames_in").add_metric(key, rel.frames_in)
        fam.counter("flowtop_relay_frames_out").add_metric(key, rel.frames_out)
        fam.counter("flowtop_relay_drops").add_metric(key, rel.drops)
        fam.counter("flowtop_relay_commands_dropped").add_metric(key, rel.commands_dropped)
        fam.gauge("flowtop_relay_link_lag_seconds").add_metric(key, rel.link_lag_s)
