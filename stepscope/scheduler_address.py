"""`--scheduler ADDRESS`: a dask scheduler's address, checked before anything connects.

dask.distributed takes `SCHEME://HOST:PORT` (tcp, tls, ws, wss, ucx) or `HOST:PORT` (tcp); given
anything else it raises a ValueError deep inside `Client()` ("missing port number in address
'local'"). Here every such input gets one line that says what was given, what an address looks
like, and that `--workers N` starts a local cluster instead.
"""

from __future__ import annotations

import re

from stepscope.errors import InputError

SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
EXAMPLE = "tcp://HOST:PORT, e.g. tcp://127.0.0.1:8786 (what `dask scheduler` prints)"
INSTEAD = "or leave --scheduler out (--workers N starts a local cluster of N workers on this machine)"

_ADDRESS = re.compile(r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>\d{1,5})")


def hint(given: str) -> str:
    return f"--scheduler {given!r}: {{}}; give a dask scheduler's address as {EXAMPLE}, {INSTEAD}"


def check(address: str) -> str:
    """The address as dask takes it (`tcp://` added when no scheme is given), or InputError."""
    text = address.strip()
    m = _ADDRESS.fullmatch(text)
    if not text:
        raise InputError(hint(address).format("an empty address"))
    if m is None:
        raise InputError(hint(address).format("not an address"))
    scheme = (m.group("scheme") or "tcp").lower()
    if scheme not in SCHEMES:
        raise InputError(hint(address).format(f"unknown scheme {scheme!r} (dask knows "
                                              f"{', '.join(SCHEMES)})"))
    port = int(m.group("port"))
    if not 1 <= port <= 65535:
        raise InputError(hint(address).format(f"port {port} is not between 1 and 65535"))
    return f"{scheme}://{m.group('host')}:{port}"


def unreachable(address: str, why: str) -> str:
    """The line for an address that is well formed but where no scheduler answers."""
    return (f"--scheduler {address}: no dask scheduler answers there ({why}); start one there "
            f"(`dask scheduler`) or give the address it prints ({EXAMPLE}), {INSTEAD}")
