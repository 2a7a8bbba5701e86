"""Tests of simtune.train."""
