"""Dagster definitions, jobs, schedules, sensors and the command line of the platform."""
