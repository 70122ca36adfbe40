"""Composition: builds the service from settings and runs it."""
