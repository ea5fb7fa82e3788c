"""What a person watches while a run goes: the step and GPU panel in Locust's web UI (/ocr), its state, and
the run's own /metrics for Prometheus."""
