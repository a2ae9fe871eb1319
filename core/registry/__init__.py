"""Plugins found through entry points: loading, checking what their hooks return, and the
target options they declare."""
