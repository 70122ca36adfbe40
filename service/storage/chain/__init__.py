"""Tamper evidence for the decision log.

The row codec, sealing, verification, the anchor and its witness, retirement,
and the sealer loop.
"""
