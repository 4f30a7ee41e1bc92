"""The CPU demo: a real multi-rank Gloo DDP training with injected faults, timed by StageTimer."""

from .faults import FAULT_KINDS, Fault, FaultSpecError, parse_fault
from .launch import DeadlineExceeded, DemoError, DemoRun, launch, read_windows
from .train import DemoConfig

__all__ = [
    "FAULT_KINDS",
    "DeadlineExceeded",
    "DemoConfig",
    "DemoError",
    "DemoRun",
    "Fault",
    "FaultSpecError",
    "launch",
    "parse_fault",
    "read_windows",
]
