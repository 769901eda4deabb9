"""The learner step: throughput and MFU, buckets, log-prob memory, overheads, the weight path."""
