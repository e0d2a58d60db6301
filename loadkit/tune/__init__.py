"""`loadkit tune`: the config space, the search strategies and the scoring of trials (pure: the
measurements are run by run/tune.py, the tables and best configs written by report/tune.py)."""
