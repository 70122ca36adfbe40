"""The command line: one module per command group, the demo and its live view."""
