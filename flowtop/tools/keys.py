"""CURVE keys for monitors that listen beyond loopback (``flowtop keys DIR``). No Textual.

Layout of a key directory (made by :func:`create`)::

    DIR/server.key          monitor public key   (give to probes)
    DIR/server.key_secret   monitor secret key   (monitor only)
    DIR/client.key          probe public key
    DIR/client.key_secret   probe secret key     (probes only)
    DIR/clients/client.key  public keys the monitor accepts (add more .key files to admit more)

The monitor runs a ZAP authenticator that admits only clients whose public key is in
``DIR/clients``; traffic is encrypted. Probes read ``FLOWTOP_CURVE_DIR``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


class KeyError_(ValueError):
    """A key directory that cannot be used."""


@dataclass(frozen=True)
class ServerKeys:
    """What the monitor needs."""

    public: bytes
    secret: bytes
    clients_dir: Path


def create(directory: str | Path) -> Path:
    """Create a server and a client key pair in ``directory`` (must not hold keys yet)."""
    import zmq.auth

    d = Path(directory)
    if (d / "server.key_secret").exists():
        raise KeyError_(f"{d} already holds keys; refusing to overwrite them")
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    zmq.auth.create_certificates(str(d), "server")
    zmq.auth.create_certificates(str(d), "client")
    (d / "clients").mkdir(exist_ok=True)
    shutil.copy(d / "client.key", d / "clients" / "client.key")
    for secret in d.glob("*.key_secret"):
        os.chmod(secret, 0o600)
    return d


def load_server(directory: str | Path) -> ServerKeys:
    """The monitor's key pair and the directory of admitted client keys."""
    import zmq.auth

    d = Path(directory)
    if not d.is_dir():  # zmq's own words were "Invalid certificate file" (a hostile-input trial)
        raise KeyError_(f"no key directory {d} (create keys with: flowtop keys {d})")
    if not (d / "server.key_secret").is_file():
        raise KeyError_(f"{d} holds no server.key_secret: not a monitor's key directory (create keys with: "
                        f"flowtop keys {d})")
    try:
        public, secret = zmq.auth.load_certificate(str(d / "server.key_secret"))
    except (OSError, ValueError) as exc:
        raise KeyError_(f"cannot load {d / 'server.key_secret'}: {exc} (create keys with: flowtop keys {d})") from None
    if secret is None:
        raise KeyError_(f"{d / 'server.key_secret'} holds no secret key")
    clients = d / "clients"
    if not clients.is_dir() or not any(clients.glob("*.key")):
        raise KeyError_(f"{clients} holds no client public keys: no probe could connect")
    check_clients(clients)
    return ServerKeys(public, secret, clients)


def check_clients(clients: Path) -> None:
    """Every ``*.key`` in ``clients`` must load as a public key: ZeroMQ's authenticator reads the
    directory whole, and one file it cannot load leaves it admitting no probe at all (it logs
    the error and the monitor would run on, refusing every key)."""
    import zmq.auth

    for path in sorted(clients.glob("*.key")):
        try:
            zmq.auth.load_certificate(str(path))
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise KeyError_(f"{path} is not a readable CURVE public key ({reason}); with it there, no probe "
                            f"would be admitted: remove it, or put a probe's client.key in its place") from None
