"""One run tied together: the Run hub, the conductor walking the plan, results and gates."""
