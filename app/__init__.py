"""The entry points: the ``trends`` command and the demo.

``cli`` (``trends``: one subcommand group per layer, imported lazily), ``demo`` (``trends demo``: the whole pipeline
on the local stack, end to end).
"""
