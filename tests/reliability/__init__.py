"""Reliability under abuse: the hostile-input table of docs/reliability.md and its runners."""
