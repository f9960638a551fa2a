"""The single-machine service: API, use-cases and the scheduling loop."""
