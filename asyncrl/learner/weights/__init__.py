"""The learner's end of the weight path (the map is in ``asyncrl.core.weights``).

publisher  ``WeightPublisher``: the control plane, the channel, the newest version sent
channel    ``ActorWeightChannel``: membership, regrouping and retries over one transport
"""
