"""Exact retrieval: the streamed top-k engine, the metrics as trec_eval defines them, the one
retrieval task every stage ranks with, and the paired significance of a lift."""
