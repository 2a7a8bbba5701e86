"""Tests of simtune.evaluate."""
