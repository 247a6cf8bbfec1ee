"""Periods: the calendar rules (keys, local dates, open ranges, their SQL forms), where
rota's history starts, and the Dagster partitions built from both."""
