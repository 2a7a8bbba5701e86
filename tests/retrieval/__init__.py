"""Tests of simtune.retrieval."""
