"""The actor's end of the weight path (the learner's end is ``asyncrl.learner.weights``, the
format and the transports ``asyncrl.core.weights``).

    receiver  the vLLM ``WeightTransferEngine`` named ``"asyncrl"``: joins, receives, loads
    plugin    the vLLM general plugin that registers it in every vLLM process
"""
