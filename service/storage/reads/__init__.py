"""What each consumer reads from the decision log."""
