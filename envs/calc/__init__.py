"""``calc``: two-step arithmetic with a calculator tool."""
