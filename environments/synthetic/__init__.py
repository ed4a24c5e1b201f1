"""Synthetic capability environments: generated modules and the sandbox they run in."""
