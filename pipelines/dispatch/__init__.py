"""Dispatch: the pure planner, the writer (read, write, binary COPY, the run), the
completeness check, and the five task assets."""
