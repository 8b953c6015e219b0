"""The app's entry points: the ``trends`` command, which names every layer, and the end-to-end demo."""
