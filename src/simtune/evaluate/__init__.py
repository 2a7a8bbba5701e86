"""The `evaluate` stage (retrieval metrics of the trained model beside the frozen baseline) and
the `search` command."""
