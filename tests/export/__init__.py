"""Tests of simtune.export."""
