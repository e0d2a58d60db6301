"""Control: talk to Triton's control plane (metadata, model configs, statistics, metrics)."""
