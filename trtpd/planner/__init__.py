"""Capacity planning: how many prefill and decode instances (and which TP) meet the SLOs."""
