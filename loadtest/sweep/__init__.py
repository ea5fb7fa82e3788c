"""Choosing server settings: the grid of settings, the server restarted for each, the whole method per
setting, and the side-by-side judgement."""
