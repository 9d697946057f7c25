"""Tables larger than memory: what ``cutfs pack`` builds for a hundred million cuts.

- :mod:`.external_sort`: rows sorted by a key in a memory budget (sorted runs spilled
  to disk, merged k ways);
- :mod:`.column_spill`: rows appended batch by batch, finished as the one record batch
  a catalogue table is, without holding it in memory;
- :mod:`.catalogue_writer`: a shard directory's cut catalogue written from cuts in any
  order, in one canonical order, with both.
"""
