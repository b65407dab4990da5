"""Muralist's Kubernetes operator: DiffusionJob -> headless Service, spec ConfigMap, Indexed Job."""
