"""Errors caused by what the user asked for. The entry point prints them as one line."""


class UserError(ValueError):
  """A bad config value, path or dataset. The message names the value and the fix."""
