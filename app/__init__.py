"""The entry points: the ``trends`` command, the served API app and the demo.

``cli`` (``trends``: one subcommand group per layer, imported lazily), ``api`` (the app ``trends serve`` serves:
serving's query API with the routes of the layers above serving, such as privacy's, mounted in), ``demo``
(``trends demo``: the whole pipeline on the local stack, end to end).
"""
