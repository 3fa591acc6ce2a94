"""Running a built net: the executor (ranges, graphs, the iteration), fusions, memory plans."""
