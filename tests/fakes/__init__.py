"""Fakes for unit tests, each satisfying the protocol of the real part it stands for."""
