"""Evaluation of the agent with and without TRACE: per-method scores, intervals and paired comparisons."""
