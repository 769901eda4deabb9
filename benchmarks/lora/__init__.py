"""LoRA against full fine-tuning (issue 44): ``sync_actor`` (weight sync, actor speed);
the learner's step is ``benchmarks.learner.throughput`` with a LoRA arm."""
