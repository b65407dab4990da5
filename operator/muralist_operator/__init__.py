"""Muralist's Kubernetes operator: DiffusionJob -> headless Service, spec ConfigMap, Indexed Job and,
unless the job or the operator's setting turns it off, a NetworkPolicy."""
