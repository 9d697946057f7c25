"""The ``cutfs`` command and the ways to run it.

- :mod:`.command`: the parser and what each subcommand does (``pack``, ``mount``,
  ``umount``, ``upgrade``, ``stats``, ``completion``, ``manpage``);
- :mod:`.manpage`: cutfs(1), made from the parser;
- :mod:`.mounted`: ``cutfs.mounted``, a mount by the command for a ``with`` block.
- :mod:`.mount_arguments`: the mount options on the command line, made from their
  declarations; :mod:`.printable`: text from data escaped for a terminal.

``python -m cutfs.vfs.cli`` runs the command (``__main__``); the installed entry point is
``cutfs.__main__``.
"""
