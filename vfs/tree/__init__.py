"""The tree a mount shows: views composed by the filesystem.

- :mod:`.filesystem`: the filesystem's behaviour as a plain class tests call without a
  mount: it composes the views, gives attributes and reads byte ranges of WAV files.
- :mod:`.view`: what a view is (its inode range, ``lookup``, ``list``); the views:
  :mod:`.cuts_view` (``cuts/``), :mod:`.recordings_view` (``recordings/`` and time ranges),
  :mod:`.windows_view` (``windows/``), :mod:`.manifests_view` (the manifests at the root,
  rendered by :mod:`.manifest_files`) and :mod:`.control_view` (``.cutfs/``).
- :mod:`.span_table`: time-range files numbered while the kernel remembers them;
  :mod:`.snapshot_store`: snapshots of volatile files, one per lookup.
"""
