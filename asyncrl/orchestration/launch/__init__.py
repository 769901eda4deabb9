"""Starting a job's roles and watching them (``asyncrl run`` / ``asyncrl launch``).

jobs           what each command does, top to bottom
launcher       roles as processes, supervised and restarted
actor_ids      the actor ids a launch claims in the buffer
resume_config  a resumed run's configuration against the one it was saved with
hostnet        this host's interfaces, checked against ``network.bind``
"""
