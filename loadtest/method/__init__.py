"""The stepped method on the master: the plan of phases, the decisions between steps, how long each phase
lasts, when a cooldown may end, when overload stops the run, the verify window's gateway (HAProxy from the
recommended config), and the live step table."""
