"""The LangGraph example: a support agent graph recorded by runledger (RunledgerSaver, journaled model and tools)."""
