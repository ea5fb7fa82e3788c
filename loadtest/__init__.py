"""The driver side of the suite, the only package that imports locust, in stages from the bottom up:
settings, traffic, method, views, wiring and launch, sweep, commands (docs/development.md, "Layout")."""
