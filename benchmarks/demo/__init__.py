"""The demo's defaults, step rate, start-up and own-task runs."""
