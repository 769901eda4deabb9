"""The top layer: the CLI, jobs, the launcher, status and the demo. It imports the roles
(``actors``, ``learner``) and the buffer; nothing below imports it.

Layers, each importing only those before it: ``asyncrl`` core (types, config, wire formats) <
``buffer`` < roles (``actors``, ``learner``) < ``asyncrl.orchestration``.
"""
