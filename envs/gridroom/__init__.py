"""``gridroom``: a 3x3 room; take the key, then open the door."""
