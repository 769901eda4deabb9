"""Security tests (issue 5): listening sockets, no pickle, config targets, sandbox."""
