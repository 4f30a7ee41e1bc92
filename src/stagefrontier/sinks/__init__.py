"""Where analyzed windows go on rank 0: the Sink protocol, the built-in sinks and `emit`."""

from .core import JsonlSink, LogSink, PacketSink, Sink, default_sinks, emit, summary_line

__all__ = ["JsonlSink", "LogSink", "PacketSink", "Sink", "default_sinks", "emit", "summary_line"]
