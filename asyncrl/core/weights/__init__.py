"""The weight path's shared half: one stream format and the transports that carry it.

One word per role, from learner to actor::

    learner.weights.publisher   rank 0 publishes version v (control plane: "v ready")
    learner.weights.channel     who is in the weight group; regroups and retries
    core.weights.<transport>    a ``Sender`` / ``Receiver`` pair: gloo, shm or nccl
    core.weights.stream         the format both ends share (buckets, checksums, acks)
    actors.weights.receiver     the vLLM worker's engine that loads what arrives

    base        the transport seam (``Sender``, ``Receiver``) and the helpers transports share
    transports  the registry: ``resolve``, ``sender``, ``receiver`` by name
"""
