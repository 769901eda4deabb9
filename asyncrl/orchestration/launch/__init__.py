"""Starting a job's roles and watching them (``asyncrl run`` / ``asyncrl launch``).

jobs           what each command does, top to bottom (the process diagram)
preflight      the checks that run before anything starts: layout, then the roles' inputs
run_info       the run directory: config, run.json, the final report
buffer_start   the job's Redis: buffer.url checked, or a private redis-server (URL files, TLS)
roles          each role's command and environment, started; what a launch stops at the end
launcher       roles as processes, supervised and restarted
actor_ids      the actor ids a launch claims in the buffer
resume_config  a resumed run's configuration against the one it was saved with
hostnet        this host's interfaces, checked against ``network.bind``
"""
