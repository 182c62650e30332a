"""Running the model: the planned rows written into the batch, decoded once, sampled; it decides
nothing. The seed's batch builder (the plan it follows is ``scheduling/scheduler.py``'s)."""
