"""The soak: the whole stack at a steady rate for an hour with a fault every 10 minutes (``make test-soak``)."""
