"""Errors that speak to the user.

Every error a user can cause (a bad recipe, an unknown run, a malformed import
file) is raised as :class:`UserError`; the CLI prints its message on stderr and
exits with status 2, without a traceback.
"""


class UserError(Exception):
    """A problem with the user's input, with a message meant to be read as is.

    The message names the file, the key (dotted path) or row, the value given
    and what is allowed, e.g.
    ``recipes/x.toml: loss.type = 'cisp' is not one of: ppo_clip, gspo, cispo``.
    """
