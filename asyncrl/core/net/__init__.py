"""What travels between processes outside the buffer: the control plane, the metrics
endpoints' registry, and the guard that keeps pickle off every wire.

    control    ZeroMQ + JSON between learner rank 0 and the actors (CURVE off loopback)
    endpoints  where each process serves ``/metrics``, for ``asyncrl status``
    wireguard  no pickle on asyncrl's wires and files (installed by ``asyncrl/__init__``)
"""
