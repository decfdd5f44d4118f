"""Guests that lie to the broker, in a folder of their own: the code hash of a sandboxed agent
is its directory's (runledger.sdk.agent.code_hash), so edits elsewhere leave it alone."""
