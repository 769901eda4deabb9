"""The top layer: the ``asyncrl`` CLI and what it starts. It imports the roles (``actors``,
``learner``) and the buffer; nothing imports it. Its rooms, lowest first:

    models/     ``model.path`` found, checked, advised on
    demo/       the demo's own tokenizer, model and warm start
    slurm/      inside a Slurm job: the keys a launch takes from Slurm's variables
    kubernetes/ ``asyncrl k8s render``: a job's Kubernetes manifests (writes YAML only)
    placement/  which GPUs each process of a node gets
    launch/     ``asyncrl run`` / ``asyncrl launch``: checks, buffer, roles, supervision
    cli.py, status.py
"""
