"""`analyze R1 R2 --scheduler ADDRESS`: an address that is not one, or where no dask scheduler
answers, ends in one line (what was given, what an address looks like, that --workers N starts a
local cluster), exit 2, no traceback. Every address here is on the loopback interface."""

from __future__ import annotations

import socket
import threading

import pytest

from stepscope import distribute
from stepscope.errors import InputError
from stepscope.scheduler_address import check
from tests.conftest import FIXTURES, CliRunner

REPORTS = [str(FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"),
           str(FIXTURES / "llama8b_decode_b1_graph_tp2.sqlite")]

pytest.importorskip("distributed")


def _analyze(address: str):
    from stepscope.cli import app

    return CliRunner().invoke(app, ["analyze", "--json", "--no-cache", *REPORTS, "--scheduler", address])


def _one_line(res) -> str:
    err = res.stderr.strip()
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "\n" not in err, err
    assert "Traceback" not in res.output and "internal error" not in err, err
    assert res.stdout == ""
    return err


@pytest.mark.parametrize("given, why", [
    ("local", "not an address"),
    ("", "an empty address"),
    ("tcp://127.0.0.1", "not an address"),
    ("127.0.0.1", "not an address"),
    ("http://127.0.0.1:8786", "unknown scheme 'http' (dask knows tcp, tls, ws, wss, ucx)"),
    ("127.0.0.1:99999", "port 99999 is not between 1 and 65535"),
    ("tcp://127.0.0.1:0", "port 0 is not between 1 and 65535"),
    ("tcp://[::1:8786", "not an address"),
])
def test_what_is_not_an_address_gets_one_line(given, why):
    err = _one_line(_analyze(given))
    assert f"--scheduler {given!r}: {why};" in err
    assert "tcp://HOST:PORT, e.g. tcp://127.0.0.1:8786" in err
    assert "--workers N starts a local cluster" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_nothing_listens(monkeypatch):
    monkeypatch.setattr(distribute, "CONNECT_TIMEOUT_S", 1.0)
    port = _free_port()
    err = _one_line(_analyze(f"127.0.0.1:{port}"))
    assert err.startswith(f"stepscope: error: --scheduler tcp://127.0.0.1:{port}: no dask scheduler answers there (")
    assert "--workers N starts a local cluster" in err


def test_a_server_that_is_not_a_scheduler_refuses(monkeypatch):
    """A listener that closes every connection at once (not dask's protocol)."""
    monkeypatch.setattr(distribute, "CONNECT_TIMEOUT_S", 1.0)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def refuse():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.close()

    t = threading.Thread(target=refuse, daemon=True)
    t.start()
    try:
        err = _one_line(_analyze(f"tcp://127.0.0.1:{port}"))
    finally:
        stop.set()
        t.join(2)
        srv.close()
    assert f"--scheduler tcp://127.0.0.1:{port}: no dask scheduler answers there" in err


def test_well_formed_addresses_pass_as_dask_takes_them():
    assert check("127.0.0.1:8786") == "tcp://127.0.0.1:8786"
    assert check(" tls://sched.example:8786 ") == "tls://sched.example:8786"
    assert check("tcp://[::1]:8786") == "tcp://[::1]:8786"
    with pytest.raises(InputError):
        check("tcp://127.0.0.1:8786/path")
