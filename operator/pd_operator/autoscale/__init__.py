"""Autoscaling: the pure decision (decide.py); signals and actuation come later."""
