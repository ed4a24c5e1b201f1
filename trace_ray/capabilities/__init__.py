"""Contrastive capability identification: labels, statistics, selection."""
