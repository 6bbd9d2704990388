"""Compute threads: the cgroup CPU quota, the thread governor and the adaptive-threads controller."""
