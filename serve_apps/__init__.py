"""Ray Serve applications: the OpenAI-compatible routed agent endpoint."""
