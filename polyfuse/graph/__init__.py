"""Graph layer: tensor-expression IR, graph of primitive ops, op kinds and micrograph partition."""
