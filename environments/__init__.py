"""Environments of the one protocol: target environments and synthetic capability environments."""
