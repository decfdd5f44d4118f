"""Framework integrations on the public SDK: each module records another framework's agents as runs.

They import only public ``runledger`` names and their framework (an extra each), never anything
private, so they show what any integration can do.
"""
