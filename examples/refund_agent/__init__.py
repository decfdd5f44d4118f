"""The example agent: a support agent that refunds orders, exactly once."""
