"""Validation samples are readable: a byte token that is half a UTF-8 character shows its bytes
(issue 27: answers were printed as '3\\ufffd3')."""

from __future__ import annotations

from verl_npu.models.loading import load_tokenizer_and_processor
from verl_npu.trainer.readable import readable_text


def test_a_lone_byte_token_shows_its_bytes_and_whole_characters_stay_text():
    tok, _ = load_tokenizer_and_processor("tiny://qwen2")
    lone = next(i for i in range(len(tok)) if "\ufffd" in tok.decode([i]))  # a byte that is not a character alone
    ids = [*tok.encode("3"), lone, *tok.encode("3")]
    decoded = tok.decode(ids)
    assert decoded == "3\ufffd3"
    shown = readable_text(tok, ids, decoded)
    assert shown.startswith("3<0x") and shown.endswith(">3") and "\ufffd" not in shown
    assert bytes.fromhex(shown[4:-2]).decode("latin-1") == tok.convert_ids_to_tokens(lone)  # the token's own byte
    accented = tok.encode("é 4")  # two byte tokens that together are one character
    assert readable_text(tok, accented, tok.decode(accented)) == "é 4"
    end = [*tok.encode("4"), lone, tok.convert_tokens_to_ids("<|im_end|>")]
    assert readable_text(tok, end, tok.decode(end, skip_special_tokens=True)).startswith("4<0x")
    assert "<|im_end|>" not in readable_text(tok, end, tok.decode(end, skip_special_tokens=True))
