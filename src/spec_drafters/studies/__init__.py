"""Tools of the studies (experiments/) and benchmarks (benchmarks/): the results files and their index,
the one resume scheme (kept stages), the statistics their tables quote. Plain Python above the CLI:
nothing below imports it."""
