"""torch's C++ log level, raised while one of the library's store calls runs, is put back in a
process forked meanwhile (a DataLoader worker forked while the collector waited on the store)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from stagefrontier.collect import store_client


def test_a_process_forked_during_a_store_call_gets_the_level_back() -> None:
    level = store_client._find_level()
    if level is None:
        pytest.skip("torch's C++ log level is not reachable here")
    before = level.value
    with store_client.quiet_cpp_log():
        assert level.value == max(before, store_client.FATAL)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its level back, and a store call of its own still works
            try:
                restored = level.value == before
                with store_client.quiet_cpp_log():
                    raised = level.value == max(before, store_client.FATAL)
                os.write(write, b"1" if restored and raised and level.value == before else b"0")
            finally:
                os._exit(0)
        os.close(write)
        answer = os.read(read, 1)
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"1"
    assert level.value == before
