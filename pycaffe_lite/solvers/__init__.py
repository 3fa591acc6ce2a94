"""Caffe's solvers: the loop, update rules, learning-rate policies, checks, snapshots."""
