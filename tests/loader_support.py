"""Datasets for the DataLoader worker tests (importable by ``spawn`` workers and by the torchrun
job): a map-style one whose samples may be slow, an iterable one, one whose worker dies, one
whose worker is held inside its exit, and one whose worker hangs."""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


def slow_sample(index: int, delay_s: float) -> torch.Tensor:
    """One sample, ``delay_s`` late (the stall the tests look for by this function's name)."""
    if delay_s:
        time.sleep(delay_s)
    return torch.full((4,), float(index))


class Samples(Dataset[torch.Tensor]):
    """``n`` samples, each ``delay_s`` late from sample ``slow_from`` on; with ``delay_from``,
    the delay is the number that file holds, read when the first slow sample is made (a job
    sizes its stall from its own healthy steps and writes it there before the workers reach
    that sample)."""

    def __init__(
        self, n: int, delay_s: float = 0.0, slow_from: int = 0, delay_from: Path | None = None
    ) -> None:
        self.n, self.delay_s, self.slow_from = n, delay_s, slow_from
        self.delay_from = delay_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index < self.slow_from:
            return slow_sample(index, 0.0)
        if self.delay_from is not None:  # once per worker: each holds its own copy
            self.delay_s, self.delay_from = float(self.delay_from.read_text()), None
        return slow_sample(index, self.delay_s)


class Stream(IterableDataset[torch.Tensor]):
    """``n`` samples split between the workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return (torch.full((4,), float(i)) for i in range(start, self.n, step))


class DiesAt(Samples):
    """Its worker process ends abruptly when it reaches sample ``at`` (with exit code 0, so the
    loader finds it dead while waiting for its batch, inside ``next()``, rather than from its
    SIGCHLD handler, which raises wherever the main thread happens to be).

    Give it a sample of the worker's first batch: a worker that dies after it sent batches can
    die while the main process is still taking one of them (the file descriptors of its
    tensors come from a thread of the worker), and the loader then raises whatever that
    exchange met (``ConnectionRefusedError``, ``ConnectionResetError``, ``EOFError``); one that
    sent nothing is only found dead ("DataLoader worker (pid(s) ...) exited unexpectedly")."""

    def __init__(self, n: int, at: int) -> None:
        super().__init__(n)
        self.at = at

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.at and get_worker_info() is not None:
            os._exit(0)
        return super().__getitem__(index)


EXIT_THREAD = {"x86_64": 60, "aarch64": 93}.get(platform.machine())
"""Linux's ``exit`` system call number, where known (it ends one thread; ``os._exit`` all)."""


class ExitHeldAt(Samples):
    """Its worker process starts its exit in sample ``at`` and is held there: it writes a byte to
    the ``told`` pipe, starts a thread that waits for a byte on the ``release`` pipe, then ends
    its main thread alone (the ``exit`` system call). Until released, the process is what a
    dying worker is for a moment: its main thread gone (``Z`` in ``/proc``, flagged exiting),
    the process not yet one its parent can reap, so ``is_alive()`` still says True. Then the
    waiting thread ends the process. Forked workers only (the pipes are inherited)."""

    def __init__(self, n: int, at: int, told: int, release: int) -> None:
        super().__init__(n)
        self.at, self.told, self.release = at, told, release

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.at and get_worker_info() is not None and EXIT_THREAD is not None:
            threading.Thread(target=self._end_when_released, daemon=True).start()
            os.write(self.told, b"1")
            # ctypes releases the GIL for the call, so the waiting thread runs on without it.
            ctypes.CDLL(None).syscall(EXIT_THREAD, 0)
        return super().__getitem__(index)

    def _end_when_released(self) -> None:
        os.read(self.release, 1)
        os._exit(0)


class HangsAt(Samples):
    """Its worker process stops in sample ``at`` for ``hang_s`` seconds, as on a stuck read (a
    loader with a ``timeout`` shorter than that raises in the training loop)."""

    def __init__(self, n: int, at: int, hang_s: float = 120.0) -> None:
        super().__init__(n)
        self.at = at
        self.hang_s = hang_s

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.at and get_worker_info() is not None:
            time.sleep(self.hang_s)
        return super().__getitem__(index)


class MarkWorker:
    """A user's ``worker_init_fn``: leaves a file per worker, so a test sees it ran."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        Path(self.folder, f"worker{worker_id}-{os.getpid()}").touch()
