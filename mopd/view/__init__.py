"""`mopd view`: a self-contained HTML page of workflow records, training traces and comparisons."""
