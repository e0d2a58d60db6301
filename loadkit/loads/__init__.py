"""Load models: how a lane sends (closed loop, open-loop rate) and the capacity search."""
