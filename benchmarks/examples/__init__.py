"""An example's recipe run as a user runs it, and what it learned written down (``run.py``)."""
