"""The protocol and evaluation stores beside the decision log."""
