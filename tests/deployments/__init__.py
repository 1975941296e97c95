"""Test helpers that build real Redis deployments: Sentinel sets, clusters, a throw-away CA."""
