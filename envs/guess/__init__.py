"""``guess``: number guessing with higher/lower feedback."""
