"""The ``echo`` task."""
