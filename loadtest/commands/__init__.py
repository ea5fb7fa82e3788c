"""`python -m loadtest`: each command's flags and what it does (run, demo, ui, worker, merge-rows, verify,
sweep, demo-sweep, gateway)."""
