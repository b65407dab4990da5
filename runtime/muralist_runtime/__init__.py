"""Muralist's in-pod runtime: runs one DiffusionJob's share of images with diffusers.

Importing this package must stay cheap and torch-free: the operator imports
`muralist_api`, and the operator image has no torch.
"""
