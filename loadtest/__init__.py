"""The only package that imports locust: users, the stepped shape, event wiring, the run CLI."""
