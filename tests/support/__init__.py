"""Helpers of the test suite, by concept (``tests`` is on the import path: see pyproject).

- :mod:`.corpus`: the test audio, made locally (espeak-ng speech, noise, ffmpeg encodings).
- :mod:`.references`: what the corpus should hold (ffmpeg's decodes, the cut plan).
- :mod:`.mounts`: real mounts by the command, and comparing served files.
- :mod:`.servers`: object-storage servers on loopback (moto, fake-gcs-server, Azurite).
- :mod:`.shards`: damaged or old-format shard copies, Arrow files, page residency.
- :mod:`.users`: a second, unprivileged user for the trust tests.
- :mod:`.pausable_fs`: a FUSE file system that can be paused, to stall a source.
"""
