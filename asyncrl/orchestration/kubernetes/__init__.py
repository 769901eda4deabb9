"""Kubernetes manifests of a job (``asyncrl k8s render``; docs/multinode.md, "Kubernetes"):
the run's overrides and a few Kubernetes options in, the objects as YAML out. Nothing here
talks to a cluster.

options   the Kubernetes options (``KubeOptions``), the objects' names, ports and mounts
args      each pod's ``asyncrl launch`` command line; every role's config composed as a pod will
pods      containers, environment (the buffer URL from the Secret), volumes, GPUs
objects   the objects: claim, NetworkPolicy, buffer StatefulSet, learner and actor indexed Jobs
render    overrides + options -> objects, written as YAML, and what to run next
command   the ``asyncrl k8s render`` parser and command
"""
