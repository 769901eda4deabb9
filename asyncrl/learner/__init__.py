"""The learner role: ``torchrun -m asyncrl.learner.main``. Its rooms, lowest first:

algo/      the math: losses, advantages, aggregation (pure functions on tensors)
compute/   every rank's model, batches and one training step
state/     checkpoints and what a resume restores
weights/   rank 0's sending end of the weight path
hub/       rank 0's I/O for the loop (``LearnerHub``): feed, recorder, validation
trainer.py (the loop), main.py (the process)
"""
