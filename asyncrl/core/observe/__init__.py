"""What every role reports: Prometheus metrics and the experiment trackers.

metrics   ``/metrics`` on loopback (``network.metrics``)
trackers  TensorBoard, Weights & Biases, MLflow (``logger=[...]``)
"""
