"""The learner's state on disk: checkpoints and what a resume restores.

checkpoint      atomic checkpoints: DCP shards, the exports, ``state.json``; manifests, pruning
export          the exports: ``hf/`` (safetensors shards) and, with LoRA, ``adapter/`` (PEFT)
run_state       ``LearnerState``: saving at a step, acking what it holds, restoring
checkpoint_hub  ``CheckpointHub``: what those ask of the hub (part of ``LearnerHub``)
"""
