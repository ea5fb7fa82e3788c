"""The stepped method on the master: the plan of phases, the decisions between steps, how long each phase
lasts, when a cooldown may end, when overload stops the run, and the live step table."""
