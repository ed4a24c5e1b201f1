"""Capability-targeted environment synthesis (TRACE step 2): difficulty calibration."""
