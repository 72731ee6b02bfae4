"""Response text for people to read (validation samples in the log and trackers).

A byte-level tokenizer can sample a token that is part of a multi-byte UTF-8 character without the
rest (a tiny random-init model does so often); decoding then yields U+FFFD, shown as '3\\ufffd3',
which says nothing. Here such a token is shown by its bytes instead: '3<0xC2>3'. Rewards still read
the plain decoded text; this is only for display.
"""

from __future__ import annotations

from functools import cache

REPLACEMENT = "\ufffd"


def readable_text(tokenizer, ids: list[int], decoded: str) -> str:
    """``decoded`` (the tokenizer's text of ``ids``) when it has no replacement character; else the
    tokens decoded one by one, each that decodes to a replacement character shown as ``<0xHH...>``
    (its bytes, from the byte-level token string), special tokens left out as in ``decoded``."""
    if REPLACEMENT not in decoded:
        return decoded
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    parts = []
    for token_id in ids:
        if token_id in special:
            continue
        piece = tokenizer.decode([token_id])
        if REPLACEMENT in piece:
            raw = _token_bytes(tokenizer, token_id)
            piece = "".join(f"<0x{b:02X}>" for b in raw) if raw else f"<token {token_id}>"
        parts.append(piece)
    return "".join(parts)


def _token_bytes(tokenizer, token_id: int) -> bytes:
    """The bytes a byte-level BPE token stands for (GPT-2's byte-to-unicode alphabet), or b'' when
    the token string is not in that alphabet."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    table = _unicode_to_byte()
    if not isinstance(token, str) or any(ch not in table for ch in token):
        return b""
    return bytes(table[ch] for ch in token)


@cache
def _unicode_to_byte() -> dict[str, int]:
    # byte-level BPE writes bytes 33-126, 161-172 and 174-255 as themselves and the other 68 bytes as
    # the code points from 256 on, in byte order
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {ch: b for b, ch in chars.items()}


def quoted_sample(text: str) -> str:
    """`text` quoted as Python shows a string (`'...'`, escapes and all), except that each run of two or
    more line breaks reads `[N line breaks]` instead of N `\\n` escapes (a model's runs of empty lines)."""
    import re

    quote = repr(text)[0]
    parts = re.split(r"(\n{2,})", text)
    body = "".join(f" [{len(p)} line breaks] " if p.startswith("\n\n") else repr(p)[1:-1] for p in parts)
    return quote + body + quote
