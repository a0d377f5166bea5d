"""VideoError, in a module of its own so that the reader and the modules it uses can all raise it."""


class VideoError(Exception):
    """A video that cannot be read or sampled as asked; the message names the file and says why."""
