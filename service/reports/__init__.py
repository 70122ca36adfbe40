"""Evidence packages people read.

`ope`: the off-policy evaluation report; `protocol`: a protocol's evidence.
"""
