"""Scheduling: the Plan of one step, the step builder, admission estimates, fair share, batch-row cap."""
