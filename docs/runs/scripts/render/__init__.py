"""docs/results.md and README's "Results at a glance", rendered from the committed run dirs (docs/runs/<run>).

One module per claim of the page, each a function that returns its markdown section; runs.py reads the run dirs
for all of them; page.py puts the sections together and glance.py writes README's table. The entry point is
docs/runs/scripts/results.py.
"""
