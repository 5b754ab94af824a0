"""Data: the data directory, dataset builders and fetch commands."""
