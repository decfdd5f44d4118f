"""The OpenAI SDK example: an agent whose ``AsyncOpenAI`` calls are recorded steps of its run."""
