"""Trace simulators, fill experiments and their reports."""
