"""What a mount counts and publishes.

- :mod:`.statistics`: counters and latency histograms of one serving process
  (``.cutfs/stats``);
- :mod:`.statistics_board`: the statistics of a mount served by several processes, added
  up;
- :mod:`.prometheus`: the same in Prometheus' text format (``.cutfs/metrics``).
"""
