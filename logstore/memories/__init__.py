"""Long-term memories: durable facts of a site that outlive a conversation."""
