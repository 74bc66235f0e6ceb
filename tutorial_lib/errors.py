"""The workbook's error classes: a mistake in what the user asked for, with a one-line message that names the
bad value and the fix. Every module raises these (`config` re-exports them: `tl.config.UserError`). Torch-free."""


class UserError(ValueError):
    """A mistake in what the user asked for. The CLI prints its one-line message and exits non-zero."""


class ConfigError(UserError):
    """A bad configuration value; the message names the field, the value and what is allowed."""


class DataNotFound(UserError):
    """A dataset that is not staged where the run looks for it; the message names the command that stages it."""
