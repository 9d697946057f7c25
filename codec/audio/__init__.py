"""The codec proper: from a recording's stored bytes to exact frames, and the WAV served.

- :mod:`.recording`: what is known of one stored recording and how to decode it;
  :mod:`.cut`: frame ranges of a recording and the one rounding of seconds to frames;
  :mod:`.seek_index`: where in a recording's bytes decoding may start.
- :mod:`.recording_indexer`: the pack-time analysis that measures a recording exactly and
  builds its seek index and plan.
- :mod:`.decoder`: any frame range decoded from the nearest seek point (FFmpeg through
  PyAV, libsndfile, or :mod:`.flac_decoder`, libFLAC itself, which checks each frame
  header with :mod:`.flac_frame`); :mod:`.float_staging` gathers a float decoder's frames
  for one conversion; :mod:`.pcm` converts to 16-bit PCM; :mod:`.riff` reads WAV headers.
- :mod:`.resampler`: any stretch resampled as if the whole recording were.
- :mod:`.output_format` and :mod:`.wav_layout`: what the served WAV files hold, and where
  each byte of them comes from.

Positions are frames of the full decode of a recording, counted from its first output
frame; seconds become frames only in :func:`.cut.seconds_to_frames`.
"""
