"""A Pydantic AI support agent that runs durably on runledger (``runledger[pydantic-ai]``)."""
