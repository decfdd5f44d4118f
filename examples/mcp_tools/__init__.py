"""An agent whose tools are an MCP server's, recorded as runledger steps (runledger.integrations.mcp)."""
