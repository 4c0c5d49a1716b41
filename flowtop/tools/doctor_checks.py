"""The checks of ``flowtop doctor``: each returns findings that say what is wrong and the fix.

A :class:`Finding` is ``ok``, ``info``, ``warn`` (monitoring works, something is missing or
degraded: no GPU telemetry, no peak for a device) or ``fail`` (something would stop monitoring:
the probe would not attach, the port is held by another program, keys unreadable, too few file
descriptors). The probe-side checks read what a child interpreter started with ``flowtop run``'s
environment reports (flowtop.tools.doctor_child); the address, key and limit checks run here.
"""

from __future__ import annotations

import os
import resource
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtop import settings

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
#: A ZeroMQ (ZMTP 3) peer greets a new connection with 10 bytes: 0xff, 8 bytes, 0x7f.
CONNECT_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Finding:
    """One result: which check, its status, what was found, how to fix it, and the figures."""

    check: str
    status: str  # ok | info | warn | fail
    summary: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)


# --- from the child interpreter ---------------------------------------------------------------

def probe_findings(child: dict[str, Any], python: str) -> list[Finding]:
    """Would the probe attach in a training process: sitecustomize, FLOWTOP_DISABLE, import, attach."""
    out: list[Finding] = []
    site = child.get("site", {})
    disable = str(child.get("flowtop_disable", "")).strip().lower()
    if disable in ("1", "true", "yes", "on"):
        out.append(Finding("disable", FAIL, f"FLOWTOP_DISABLE={child['flowtop_disable']} is set: the probe stays off "
                           "in every process", "unset FLOWTOP_DISABLE (or set it to 0) in the training's environment",
                           {"FLOWTOP_DISABLE": child["flowtop_disable"]}))
    elif disable:  # set, to something that leaves the probe on: say so, not "not set"
        out.append(Finding("disable", OK, f"FLOWTOP_DISABLE={child['flowtop_disable']}: the probe stays on",
                           details={"FLOWTOP_DISABLE": child["flowtop_disable"]}))
    else:
        out.append(Finding("disable", OK, "FLOWTOP_DISABLE is not set", details={"FLOWTOP_DISABLE": disable}))
    if not site.get("ours_ran"):
        why = ("the interpreter ran without site (-S)" if site.get("no_site") else
               "the interpreter ignores PYTHONPATH (-E or -I)" if site.get("ignore_environment") else
               f"another sitecustomize came first: {site.get('active_file')}")
        out.append(Finding("sitecustomize", FAIL, f"flowtop's bootstrap sitecustomize did not run in {python}: {why}",
                           "run training as `flowtop run -- CMD` and keep PYTHONPATH's first entry (flowtop puts its "
                           "bootstrap there); or call `import probe; probe.attach()` in the training script", site))
    else:
        out.append(Finding("sitecustomize", OK, f"flowtop's bootstrap runs first ({site.get('ours_file')})",
                           details=site))
    if site.get("user_file"):
        out.append(Finding("user sitecustomize", INFO, f"your own sitecustomize ({site['user_file']}) is chained: it "
                           "runs right after flowtop's, as before", details={"file": site["user_file"]}))
    probe = child.get("probe", {})
    if not probe.get("ok"):
        out.append(Finding("probe import", FAIL, f"the probe package does not import in {python}: {probe.get('error')}",
                           "install flowtop into the training's environment (pip install flowtop) or run from its "
                           "source tree", probe))
    else:
        out.append(Finding("probe import", OK, f"probe {probe.get('version')} imports from {probe.get('file')}",
                           details=probe))
    attach = child.get("attach", {})
    if not attach.get("tried"):
        out.append(Finding("attach", WARN, f"attach not tried: {attach.get('error')}",
                           "install torch in the training's interpreter (the probe hooks torch.optim)", attach))
    elif attach.get("attached"):
        out.append(Finding("attach", OK, "the probe attached when a torch.optim optimizer was built", details=attach))
    else:
        reason = attach.get("error") or ("FLOWTOP_DISABLE is set" if disable in ("1", "true", "yes", "on")
                                         else "no hook fired")
        out.append(Finding("attach", FAIL, f"building an optimizer did not attach the probe: {reason}",
                           "see the findings above (FLOWTOP_DISABLE, sitecustomize); an explicit probe.attach() works "
                           "without the bootstrap", attach))
    return out


def device_findings(child: dict[str, Any]) -> list[Finding]:
    """torch, NVML, GPM and the peak per visible device."""
    out: list[Finding] = []
    torch = child.get("torch", {})
    if torch.get("ok"):
        cuda = (f"CUDA {torch.get('cuda')}, {len(torch.get('devices', []))} device(s) visible"
                if torch.get("cuda_available") else "no CUDA device visible (CPU training: host operator times)")
        out.append(Finding("torch", OK, f"torch {torch.get('version')}; {cuda}", details=torch))
    else:
        out.append(Finding("torch", WARN, f"torch does not import: {torch.get('error')}",
                           "install torch where the training runs (pip install torch); a monitor-only node needs none",
                           torch))
    nvml = child.get("nvml", {})
    if nvml.get("ok"):
        out.append(Finding("nvml", OK, f"NVML {nvml.get('nvml_version')}, driver {nvml.get('driver')}, "
                           f"{len(nvml.get('devices', []))} GPU(s)", details=nvml))
        for dev in nvml.get("devices", []):
            if dev.get("gpm"):
                out.append(Finding("gpm", OK, f"GPU {dev['index']} {dev['name']}: GPM on (tensor-pipe and SM activity)",
                                   details=dev))
            else:
                out.append(Finding("gpm", INFO, f"GPU {dev['index']} {dev['name']}: {dev.get('gpm_reason')}; "
                                   "tensor-active ratio n/a, GPU-Util still reported", details=dev))
    else:
        level = WARN if torch.get("cuda_available") else INFO
        out.append(Finding("nvml", level, f"no GPU telemetry: {nvml.get('error')}",
                           "install the NVIDIA driver and nvidia-ml-py on GPU nodes; on a CPU-only node nothing to do",
                           nvml))
    for p in child.get("peaks", []):
        label = f"{p['device']} {p['dtype']}"
        if p.get("flops"):
            from flowtop.monitor.format import rate_prefix

            scale, prefix = rate_prefix([p["flops"]])
            # This interpreter's figure; a CPU rank's is smaller where it computes on fewer cores
            # (a new user met 156 GFLOP/s here and 78 in each of two torchrun ranks' MFU).
            ranks = ("; a CPU rank's own peak counts only the cores it computes on (its torch threads, at most "
                     "its share of the host)") if str(p["device"]).startswith("cpu") else ""
            summary = f"{label}: {p['flops'] / scale:,.1f} {prefix}FLOP/s from {p['source']}{ranks}"
            out.append(Finding("peak", OK, summary, details=p))
        else:
            bad_override = "FLOWTOP_PEAK_TFLOPS" in p.get("reason", "") and "peak must" in p.get("reason", "")
            out.append(Finding("peak", FAIL if bad_override else WARN, f"{label}: no peak ({p.get('reason')}): MFU n/a",
                               "set FLOWTOP_PEAK_TFLOPS=<dense TFLOP/s per rank> (or flowtop top --peak-tflops)", p))
    return out


# --- here ------------------------------------------------------------------------------------

def address_findings(listen: str, curve_dir: str | None, insecure: bool) -> list[Finding]:
    """Is ``listen`` well-formed, allowed without keys, free to bind or answered by a monitor?"""
    from flowtop.monitor.collector import AddressError, is_loopback, parse_tcp

    try:
        host, port = parse_tcp(listen)
    except AddressError as exc:
        return [Finding("address", FAIL, str(exc), "give tcp://HOST:PORT, e.g. tcp://127.0.0.1:5759")]
    out: list[Finding] = []
    loopback = is_loopback(host)
    if loopback:
        out.append(Finding("security", OK, f"{listen} is loopback: no keys needed (probes on this host only)"))
    elif curve_dir:
        out.append(Finding("security", OK, f"{listen} is beyond loopback, with CURVE keys from {curve_dir}"))
    elif insecure:
        out.append(Finding("security", WARN, f"{listen} is beyond loopback without authentication (--insecure-bind)",
                           "create keys (flowtop keys DIR) and use --curve-dir DIR on both sides"))
    else:
        out.append(Finding("security", FAIL, f"{listen} is beyond loopback and no CURVE keys are given: the monitor "
                           "refuses to bind it and probes would not be admitted",
                           "flowtop keys DIR once, then --curve-dir DIR for the monitor and FLOWTOP_CURVE_DIR=DIR (or "
                           "flowtop run --curve-dir DIR) for the probes"))
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return out + [Finding("address", FAIL, f"host {host!r} of {listen} does not resolve: {exc}",
                              "use an IP address or a name this host resolves")]
    family, _, _, _, sockaddr = infos[0]
    out.append(_probe_port(listen, family, sockaddr, _is_local(family, host)))
    return out


def _is_local(family: int, host: str) -> bool:
    """Whether ``host`` is an address of this machine (a monitor could bind it here)."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
            return True
        except OSError:
            return False


def _probe_port(listen: str, family: int, sockaddr: Any, local: bool) -> Finding:
    details: dict[str, Any] = {"local": local}
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            s.connect(sockaddr)
            greeting = _read_greeting(s)
        except ConnectionRefusedError:
            greeting = None
            details["connect"] = "refused"
        except (socket.timeout, OSError) as exc:
            details["connect"] = f"{type(exc).__name__}: {exc}"
            if local:
                return Finding("port", WARN, f"{listen}: connecting here failed ({details['connect']})", "", details)
            return Finding("port", WARN, f"no answer from {listen} within {CONNECT_TIMEOUT_S:.0f} s "
                           f"({details['connect']}): probes here cannot reach a monitor there",
                           "start the monitor there (flowtop top/serve --listen ...), check firewalls", details)
    if greeting is None:
        if local:
            return Finding("port", OK,
                           f"{listen} is free: flowtop top / flowtop serve can bind it (no monitor there yet)",
                           "start the monitor: flowtop --listen " + listen, details)
        return Finding("port", WARN, f"nothing listens at {listen} (connection refused): no monitor there yet",
                       "start the monitor on that host with --listen " + listen, details)
    details["greeting"] = greeting.hex()
    if greeting[:1] == b"\xff" and (len(greeting) < 10 or greeting[9:10] == b"\x7f"):
        return Finding("port", OK, f"a ZeroMQ listener (a flowtop monitor) answers at {listen}: probes from here "
                       "reach it", "", details)
    return Finding("port", FAIL, f"{listen} is held by a program that is not a flowtop monitor (no ZeroMQ greeting): "
                   "a monitor cannot bind it and probes cannot report to it",
                   "stop that program or pick another port: flowtop --listen tcp://HOST:OTHER and "
                   "flowtop run --connect tcp://HOST:OTHER", details)


def _read_greeting(s: socket.socket) -> bytes:
    try:
        return s.recv(10)
    except (socket.timeout, OSError):
        return b""  # accepted but silent: not ZeroMQ either


def key_findings(curve_dir: str | None, loopback_ok: bool = True) -> list[Finding]:
    """Every key file of a CURVE directory present and readable, for the monitor and for probes.
    Without a directory: that it is fine on loopback, unless the security check found the address
    beyond it (``loopback_ok`` False: its fail or warning says what keys are for already, and
    "fine on loopback" after it read as a contradiction)."""
    if not curve_dir:
        if not loopback_ok:
            return []
        return [Finding("keys", INFO, "no CURVE directory given (--curve-dir or FLOWTOP_CURVE_DIR): fine on loopback")]
    import zmq.auth

    d = Path(curve_dir)
    unusable = _key_dir_finding(d)
    if unusable is not None:  # one finding for the directory, not one per file it hides
        return [unusable]
    wanted = (("server.key_secret", "monitor"), ("server.key", "probes"), ("client.key_secret", "probes"))
    out: list[Finding] = []
    for name, who in wanted:
        path = d / name
        try:
            with open(path, "rb"):  # missing or unreadable: OSError with its reason
                pass
            public, secret = zmq.auth.load_certificate(str(path))
            if name.endswith("_secret") and secret is None:
                raise ValueError("no secret key in it")
            out.append(Finding("keys", OK, f"{path} readable ({who})"))
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if isinstance(exc, FileNotFoundError):
                fix = f"create keys: flowtop keys {d} (a new directory), or copy {name} from the directory that has it"
            elif isinstance(exc, OSError):
                fix = f"let the {who}' user read it (chmod/chown {path}); the directory needs x for them too"
            else:
                fix = f"{path} is not a ZeroMQ key file: recreate the keys with flowtop keys DIR"
            out.append(Finding("keys", FAIL, f"{path} ({who}) cannot be read: {reason}", fix, {"path": str(path)}))
    clients = d / "clients"
    admitted: list[str] = []
    try:
        admitted = sorted(p.name for p in clients.glob("*.key")) if clients.is_dir() else []
        for name in admitted:
            path = clients / name
            zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, PermissionError) or not admitted:
            fix = f"chmod/chown {clients} and its files for the monitor's user"
        else:  # one file that is not a key: ZeroMQ's authenticator then admits no probe at all
            fix = f"remove {path}, or put a probe's client.key in its place (one bad file locks out every probe)"
        out.append(Finding("keys", FAIL, f"{clients} cannot be read: {reason}", fix))
        return out
    if admitted:
        out.append(Finding("keys", OK, f"{len(admitted)} admitted probe key(s) in {clients}"))
    else:
        out.append(Finding("keys", FAIL, f"{clients} holds no client public keys: no probe would be admitted",
                           f"copy a probe's client.key into {clients}/ (flowtop keys {d} does it)"))
    return out


def _key_dir_finding(d: Path) -> Finding | None:
    """Why ``d`` cannot be used as a key directory at all (missing, not a directory, not
    searchable by this user), or None when its files can be looked at one by one."""
    try:
        st = d.stat()
    except FileNotFoundError:
        return Finding("keys", FAIL, f"{d} does not exist", f"create the keys: flowtop keys {d}", {"path": str(d)})
    except OSError as exc:  # a parent directory this user cannot search
        return Finding("keys", FAIL, f"{d} cannot be looked at: {exc.strerror or exc}",
                       f"let this user search every directory above {d} (chmod o+x or g+x on them)", {"path": str(d)})
    if not stat.S_ISDIR(st.st_mode):
        return Finding("keys", FAIL, f"{d} is not a directory", f"give the directory flowtop keys DIR made (not {d})",
                       {"path": str(d)})
    try:
        os.stat(d / "server.key")  # needs x on d: a missing file is fine here, the checks below say so
    except FileNotFoundError:
        pass
    except PermissionError:
        mode, owner = stat.S_IMODE(st.st_mode), _owner(st.st_uid)
        return Finding("keys", FAIL, f"{d} cannot be entered by this user (mode {mode:04o}, owner {owner}): no key "
                       "file in it can be read, by the monitor or the probes",
                       f"chmod u+rx {d} (flowtop keys makes it 0700 for its owner); for other users who run the "
                       f"monitor or the training, g+rx with a shared group: chgrp GROUP {d} && chmod g+rx {d}",
                       {"path": str(d), "mode": f"{mode:04o}", "owner": owner})
    return None


def _owner(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def fd_findings(ranks: int | None) -> list[Finding]:
    """Connections the monitor could take: the soft limit raised to the hard one, less what is open."""
    from flowtop.monitor.fdwatch import capacity, open_files

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = hard if hard != resource.RLIM_INFINITY else 1 << 16  # what the monitor raises itself to
    used = open_files(limit)
    room = capacity(limit, used)
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    details = {"soft": soft, "hard": hard_text, "used": used, "capacity": room, "ranks": ranks}
    text = (f"open-file limit {soft} (hard {hard_text}): a monitor here can take about {room:,} probe or relay "
            "connections")
    if ranks is None:
        return [Finding("open files", INFO, text + " (give --ranks N to check a job size)", details=details)]
    if room >= ranks:
        return [Finding("open files", OK, f"{text}: enough for {ranks:,} ranks", details=details)]
    return [Finding("open files", FAIL,
                    f"{text}: fewer than the {ranks:,} ranks expected; the others would not be seen",
                    f"run node relays (flowtop run --relay on: one connection per node, {-(-ranks // 8):,} for 8 ranks "
                    "a node) or raise the hard limit (ulimit -Hn, /etc/security/limits.conf)", details)]


def child_python_finding(python: str, rc: int, stderr: str) -> Finding:
    """The child interpreter itself did not run or report."""
    return Finding("child", FAIL, f"{python} with flowtop run's environment did not report (exit {rc}): "
                   f"{stderr.strip()[-400:] or 'no output'}", "check that this interpreter runs: " + python,
                   {"rc": rc})


def env_keys() -> str | None:
    """FLOWTOP_CURVE_DIR of the environment ("" counts as unset)."""
    return settings.CURVE_DIR.read()
