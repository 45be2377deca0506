"""Runnable agents: the default one the demo and services use, and every seed example.

Select one with ``BARGEIN_AGENT=bargein.examples.<module>:<function>``.
"""
