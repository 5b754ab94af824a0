"""Trainer side: the entry point that launches verl's trainer with our recipes."""
