"""Peer implementations vendored verbatim for comparison tests (tests/unit/learner/test_losses_vs_peers.py):
verl (verl_core_algos.py) and AReaL (areal_functional.py), both Apache-2.0; each file's header
names the source repository, commit and paths. Not imported by asyncrl itself."""
