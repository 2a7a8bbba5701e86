"""Tests of simtune.cache."""
