"""The HTTP side of a process: the health and metrics server, and the metrics it serves."""
