"""The single controller's machinery: resource pools, worker groups, dispatch."""
