"""Training-time reads and flag writes: query specs and rows, the result cache, mark."""
