"""Tests of hf_recurrence.evaluation."""
