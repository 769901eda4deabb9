"""Security tests: listening sockets, no pickle, config targets, sandbox."""
