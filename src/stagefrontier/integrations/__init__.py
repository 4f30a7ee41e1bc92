"""Integrations with the tools training jobs already use.

Nothing here is imported by ``import stagefrontier``: each module needs its optional extra and
raises :class:`MissingExtraError` naming it when the package is absent.

- :mod:`stagefrontier.integrations.sinks`: the TensorBoard, Prometheus, W&B and CSV sinks
  re-exported from :mod:`stagefrontier.sinks`, where they live.
- :mod:`stagefrontier.integrations.lightning`: a Lightning ``Callback``.
- :mod:`stagefrontier.integrations.transformers`: a Hugging Face ``TrainerCallback``.
- :func:`make_timer`: a ``StageTimer`` whose rank-0 analysis also writes to extra sinks.
"""

from ..errors import MissingExtraError
from ._timer import make_timer

__all__ = ["MissingExtraError", "make_timer"]
