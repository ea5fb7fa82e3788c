"""What one run is told, checked before any load: its settings (RunConfig) and their Locust options and
flags, the timing limits they imply, the open-loop settings, the manifest and the suite's version."""
