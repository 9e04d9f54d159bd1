"""Read a sentencepiece ``.model`` file (``spiece.model``, ``sentencepiece.bpe.model``, ...).

A sentencepiece model is one protobuf message, ``ModelProto``. The few fields a tokenizer
needs are read here straight from the wire format, so neither ``sentencepiece`` nor
``protobuf`` is imported:

* ``pieces`` (field 1): the vocabulary in id order, each ``(piece, score, type)``;
* ``trainer_spec`` (field 2): the algorithm (unigram / BPE), the byte fallback, the ids and
  strings of ``<unk>``, ``<s>``, ``</s>``, ``<pad>``;
* ``normalizer_spec`` (field 3): the precompiled character map (the compiled NFKC-like rules
  ``tokenizers.normalizers.Precompiled`` runs) and the whitespace options.

Fields that are absent take the defaults of ``sentencepiece_model.proto``; fields not read
here are skipped by wire type.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PIECE_TYPES", "SentencePieceModel", "read_model"]

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
PIECE_TYPES = {
    NORMAL: "normal",
    UNKNOWN: "unknown",
    CONTROL: "control",
    USER_DEFINED: "user_defined",
    UNUSED: "unused",
    BYTE: "byte",
}
# TrainerSpec.ModelType
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


@dataclass
class SentencePieceModel:
    """What a tokenizer needs from a sentencepiece ``ModelProto``.

    ``pieces[i] = (piece, score, type)`` is the piece of id ``i``; ``type`` is one of
    :data:`PIECE_TYPES` (1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte).
    """

    pieces: list[tuple[str, float, int]] = field(default_factory=list)
    model_type: str = "unigram"
    byte_fallback: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    unk_piece: str = "<unk>"
    bos_piece: str = "<s>"
    eos_piece: str = "</s>"
    pad_piece: str = "<pad>"
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True

    def vocab(self) -> list[tuple[str, float]]:
        """``[(piece, score), ...]`` in id order."""
        return [(piece, score) for piece, score, _ in self.pieces]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """``(value, next position)`` of the base-128 varint at ``pos``."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated sentencepiece model: a varint runs past the end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed sentencepiece model: a varint is longer than 10 bytes")


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """The ``(field number, wire type, value)`` of one message: varints as ints, fixed
    32/64-bit values and length-delimited fields as their raw bytes."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"malformed sentencepiece model: unsupported wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated sentencepiece model: a field runs past the end")
        out.append((number, wire, value))
    return out


def _int32(value: int) -> int:
    """A varint read as a signed 32/64-bit integer (negative ids are 10-byte varints)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _piece(data: bytes) -> tuple[str, float, int]:
    piece, score, kind = "", 0.0, NORMAL
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:
            piece = value.decode("utf-8")
        elif number == 2 and wire == 5:
            score = struct.unpack("<f", value)[0]
        elif number == 3 and wire == 0:
            kind = value
    return piece, score, kind


_TRAINER_INTS = {40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}
_TRAINER_STRINGS = {45: "unk_piece", 46: "bos_piece", 47: "eos_piece", 48: "pad_piece"}
_NORMALIZER_BOOLS = {3: "add_dummy_prefix", 4: "remove_extra_whitespaces", 5: "escape_whitespaces"}


def read_model(source: str | Path | bytes) -> SentencePieceModel:
    """A sentencepiece model from its file (or its bytes).

    Raises:
        ValueError: the data is not a sentencepiece ``ModelProto`` (no pieces, bad wire data).
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    name = "<bytes>" if isinstance(source, bytes) else str(source)
    model = SentencePieceModel()
    try:
        for number, wire, value in _fields(data):
            if number == 1 and wire == 2:
                model.pieces.append(_piece(value))
            elif number == 2 and wire == 2:
                for n, w, v in _fields(value):
                    if n == 3 and w == 0:
                        model.model_type = MODEL_TYPES.get(v, str(v))
                    elif n == 35 and w == 0:
                        model.byte_fallback = bool(v)
                    elif n in _TRAINER_INTS and w == 0:
                        setattr(model, _TRAINER_INTS[n], _int32(v))
                    elif n in _TRAINER_STRINGS and w == 2:
                        setattr(model, _TRAINER_STRINGS[n], v.decode("utf-8"))
            elif number == 3 and wire == 2:
                for n, w, v in _fields(value):
                    if n == 2 and w == 2:
                        model.precompiled_charsmap = bytes(v)
                    elif n in _NORMALIZER_BOOLS and w == 0:
                        setattr(model, _NORMALIZER_BOOLS[n], bool(v))
    except (UnicodeDecodeError, struct.error) as e:
        raise ValueError(f"{name} is not a sentencepiece model: {e}") from None
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if not model.pieces:
        raise ValueError(f"{name} is not a sentencepiece model (it has no pieces)")
    return model
