"""Searches over what to measure next: `loadkit capacity`'s rate search (capacity.py) and
`loadkit tune`'s config search (space.py, strategies.py, score.py, resume.py). Pure: the
measurements are run by run/capacity.py and run/tune.py, the tables written by report/."""
