"""The servers of the local stack, one module each.

``base`` (what every server is), ``kafka``, ``cassandra``, ``spark`` (a standalone cluster), ``pipeline`` (the
streaming job and the API run like servers), ``prometheus`` (the batch exporter and a Prometheus server),
``toxiproxy`` (TCP proxies for network faults), ``registry`` (a schema registry for the Kafka bridge's sources).
"""
