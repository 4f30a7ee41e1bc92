"""``stagefrontier run``: a training script launched as torchrun would, instrumented unchanged.

- :mod:`.options`: the run's settings, carried to each worker in its environment;
- :mod:`.command`: the ``run`` subcommand (torchrun's own launcher, the script wrapped);
- :mod:`.worker`: each worker's bootstrap (``python -m stagefrontier.run``) and the
  environment switch (``STAGEFRONTIER_AUTO=1``).
"""
