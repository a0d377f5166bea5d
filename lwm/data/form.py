"""How a source's records become examples: its form, said by the source, never guessed from column names.

    Form(fields="[video],caption", media=("video",), media_root="/data/clips")
    Form(conversation="conversations", media=("video", "image"))

fields: the default spec (lwm.data.example) of records without their own. media: the columns whose values
are media files (a video or an image, or a list of them), paths relative to media_root (absolute ones must
lie inside it too); such a column in a spec expands to the codes lwm-tokenize cached for that file (an
image is a one-frame video). conversation: the column holding a conversation (LLaVA's "conversations":
turns of {"from", "value"}, or {"role", "content"}); a record is then that conversation (lwm.data.
conversation), its media where its `<video>` and `<image>` placeholders are, and the spec is not used.
roles: the conversation's role names -> user, assistant or system. direction (LWM-Chat's, per source):
"understanding" trains each spec as written (a caption's "[clip],caption": the media, then the text with loss),
"generation" the other way round (the groups in reverse order, each carrying loss where it did not:
"[caption],clip", text to video), "both" either one, chosen per example by a seeded draw.

A field whose name holds "vision" is a cached video's id, as LWM's own format writes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

VIDEO_EXTENSIONS = frozenset(".mp4 .m4v .mkv .webm .avi .mov .mpg .mpeg .ts .flv .wmv .3gp .ogv".split())
IMAGE_EXTENSIONS = frozenset(".jpg .jpeg .png .webp .bmp .gif .tif .tiff".split())
MEDIA_EXTENSIONS = VIDEO_EXTENSIONS | IMAGE_EXTENSIONS
ROLES = ("user", "assistant", "system")
# LWM-Chat's directions: media then text with loss on the text, text then media with loss on the codes, or either
DIRECTIONS = ("understanding", "generation", "both")
# LLaVA's and Video-ChatGPT's role names, and the chat-message ones
DEFAULT_ROLES = {"human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant", "system": "system"}


class MediaError(ValueError):
    """A media value that cannot be used; the message names the column and the value."""


def is_image(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def looks_like_media(value) -> bool:
    """A text value that is the path of a media file (no spaces, a media extension): a column the source
    did not declare in `media`."""
    return (
        isinstance(value, str)
        and 0 < len(value) < 4096
        and not any(c.isspace() for c in value)
        and (Path(value).suffix.lower() in MEDIA_EXTENSIONS)
    )


@dataclass(frozen=True)
class Form:
    fields: str | tuple | None = None
    media: tuple[str, ...] = ()
    media_root: str | None = None  # absolute
    conversation: str | None = None
    roles: tuple[tuple[str, str], ...] = tuple(DEFAULT_ROLES.items())
    direction: str | None = None  # None: each spec as written

    @staticmethod
    def of(spec) -> "Form":
        """A Form as given, or the form of a plain default spec (a string, a list, or None)."""
        return spec if isinstance(spec, Form) else Form(fields=tuple(spec) if isinstance(spec, list) else spec)

    def spec(self):
        return list(self.fields) if isinstance(self.fields, tuple) else self.fields

    def signature(self) -> dict:
        """What an index of the source depends on: a change makes it stale."""
        sig = {"fields": self.spec()}
        if self.media or self.conversation or self.direction:
            sig["form"] = {"media": list(self.media), "media_root": self.media_root, "conversation": self.conversation}
            sig["form"].update(roles=[list(r) for r in self.roles], direction=self.direction)
        return sig

    def media_paths(self, record: dict, column: str) -> list[str]:
        """The absolute paths a media column of a record names, in order: one path or a list of them."""
        value = record.get(column)
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise MediaError(f"media column {column!r} holds {value!r}; expected a file path or a list of them")
        root = Path(self.media_root or ".")
        paths = []
        for v in values:
            path = os.path.normpath(root / v.strip())  # no symlink followed: the path lwm-tokenize recorded
            if os.path.commonpath([path, str(root)]) != str(root):
                raise MediaError(
                    f"media column {column!r}: {v!r} leads out of the media root {root}; a media path names a "
                    "file inside it"
                )
            paths.append(path)
        return paths

    def undeclared_media(self, record) -> list[str]:
        """The record's text columns that hold media paths: read as text, since the source does not name them
        in its media (a column whose name holds "vision" is a cached video's id)."""
        if not isinstance(record, dict):
            return []
        return [k for k, v in record.items() if k not in self.media and "vision" not in k and looks_like_media(v)]

    def role(self, name) -> str | None:
        return dict(self.roles).get(name)


def source_form(path: str, fields, media, media_root, conversation, roles, direction=None) -> Form:
    """A source's Form with its media root made absolute (None: the source file's folder)."""
    root = Path(media_root).expanduser() if media_root is not None else Path(path).expanduser().parent
    return Form(
        fields=tuple(fields) if isinstance(fields, (list, tuple)) else fields,
        media=tuple(media),
        media_root=os.path.abspath(root),
        conversation=conversation,
        roles=tuple((roles or DEFAULT_ROLES).items()),
        direction=direction,
    )
