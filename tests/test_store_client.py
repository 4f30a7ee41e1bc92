"""torch's C++ log level, raised while one of the library's store calls runs: only as far as the
call needs (an application's own C++ error still shows during a library read), and put back in a
process forked meanwhile (a DataLoader worker forked while the collector waited on the store)."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest

pytest.importorskip("torch")

from rank_support import refused_port
from stagefrontier.collect import store_client
from stagefrontier.collect.node_store import loopback_store


def test_a_process_forked_during_a_store_call_gets_the_level_back() -> None:
    level = store_client._find_level()
    if level is None:
        pytest.skip("torch's C++ log level is not reachable here")
    before = level.value
    with store_client.quiet_cpp_log(store_client.FATAL):
        assert level.value == max(before, store_client.FATAL)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its level back, and a store call of its own still works
            try:
                restored = level.value == before
                with store_client.quiet_cpp_log():
                    raised = level.value == max(before, store_client.ERROR)
                os.write(write, b"1" if restored and raised and level.value == before else b"0")
            finally:
                os._exit(0)
        os.close(write)
        answer = os.read(read, 1)
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"1"
    assert level.value == before


def test_an_applications_own_cpp_error_during_a_library_read_reaches_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before, every library store call held the level at FATAL: the application's own c10d
    error, logged while one of the library's reads waited on its store, was never printed."""
    import torch.distributed as dist

    level = store_client._find_level()
    if level is None:
        pytest.skip("torch's C++ log level is not reachable here")
    if level.value > store_client.ERROR:
        pytest.skip("TORCH_CPP_LOG_LEVEL holds errors back in this process")
    server = loopback_store()
    client = dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=120)
    )
    library = store_client.QuietStore(client)
    answers: list[bytes] = []
    # The library's read: waits on its store until the key is set (a hung store's read).
    reader = threading.Thread(target=lambda: answers.append(library.get("released")))
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not store_client._holds:  # the read has begun
            assert reader.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        capfd.readouterr()
        # Meanwhile the application connects to a port nobody listens on: c10d logs an ERROR.
        with refused_port() as port, pytest.raises(dist.DistNetworkError):
            dist.TCPStore(
                "127.0.0.1",
                port,
                is_master=False,
                timeout=timedelta(seconds=0.3),
                wait_for_workers=False,
            )
        held = level.value
    finally:
        server.set("released", "1")
        reader.join()
    err = capfd.readouterr().err
    assert any(
        line.startswith("[E") and f"127.0.0.1, {port}" in line for line in err.splitlines()
    ), err
    assert held == max(store_client._saved, store_client.ERROR)  # not FATAL
    assert answers == [b"1"]
    assert level.value == store_client._saved
