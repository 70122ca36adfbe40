"""Understudy: shadow evaluation of compute placement policies.

Runtime mirrors placement requests; Understudy scores candidate policies on them
without acting, logs every counterfactual decision, joins delayed outcomes and
estimates what each candidate would have achieved.
"""

__version__ = "0.1.0"
