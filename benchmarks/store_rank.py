"""The start of a rank script shared by ``close_deadline.py`` (its hung-store probe) and the
test of a store that dies mid-run: a timer whose windows go through a real TCP store, with a
profiler router polling that store. Each caller appends what its rank does next.

The script's arguments: the rank, the world size, the store's port, the output folder, and the
seconds each step sleeps; ``steps(count)`` trains that many steps. Warnings go to stderr, as an
application that configures logging shows them.
"""

STORE_RANK = """\
import json, logging, resource, sys, time
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
from stagefrontier import ProfilerRouter, StageTimer, TimerConfig
from stagefrontier.collect import CollectorSettings, StoreCollector

rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
folder, step_s = Path(sys.argv[4]), float(sys.argv[5])
logging.basicConfig(format="app %(message)s")
client = dist.TCPStore(
    "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False
)
settings = CollectorSettings(rank, world, folder, 2.0, regression=None)
timer = StageTimer(
    config=TimerConfig(
        stages=["data.next_wait"], window=5, router=ProfilerRouter(store=client, poll_s=0.05)
    ),
    collector=StoreCollector(settings, store=client),
)


def steps(count):
    for _ in range(count):
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(step_s)


"""
