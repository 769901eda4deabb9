"""The learner's state on disk: checkpoints and what a resume restores.

checkpoint      atomic checkpoints: DCP shards, an HF safetensors export, ``state.json``
run_state       ``LearnerState``: saving at a step, acking what it holds, restoring
checkpoint_hub  ``CheckpointHub``: what those ask of the hub (part of ``LearnerHub``)
"""
