"""Locust's events joined to the rest: the master's and workers' listeners, their messages (versions,
image sets, rows, workers that drop out), and the stepped shape Locust ticks."""
