"""Sub-byte packing: an LSB-first bit stream along the last axis.

4-bit: element 2i in the low nibble of byte i, 2i+1 in the high nibble.
6-bit: four codes fill three bytes; code j of a group occupies bits [6j, 6j+6) of the
little-endian 24-bit word. Odd lengths are padded with zero codes.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.spec import assert_same_floats

import nqdq
from nqdq.reference.packing import pack_codes, packed_length, unpack_codes


def test_4bit_hand_worked():
    # [1, 2, 3] -> byte 0 = 1 | 2 << 4 = 0x21, byte 1 = 3 | (pad 0) << 4 = 0x03
    assert pack_codes(np.array([1, 2, 3], np.uint8), 4).tolist() == [0x21, 0x03]
    # [0xF, 0x0, 0xA, 0x5] -> 0x0F, 0x5A
    assert pack_codes(np.array([0xF, 0x0, 0xA, 0x5], np.uint8), 4).tolist() == [0x0F, 0x5A]


def test_6bit_hand_worked():
    # [1, 2, 3, 4] -> word = 1 | 2 << 6 | 3 << 12 | 4 << 18 = 0x103081 -> bytes 81 30 10
    assert pack_codes(np.array([1, 2, 3, 4], np.uint8), 6).tolist() == [0x81, 0x30, 0x10]
    # one code of all ones in each of the four slots: 63 << 0, 6, 12, 18
    assert pack_codes(np.array([63, 0, 0, 0], np.uint8), 6).tolist() == [0x3F, 0x00, 0x00]
    assert pack_codes(np.array([0, 63, 0, 0], np.uint8), 6).tolist() == [0xC0, 0x0F, 0x00]
    assert pack_codes(np.array([0, 0, 63, 0], np.uint8), 6).tolist() == [0x00, 0xF0, 0x03]
    assert pack_codes(np.array([0, 0, 0, 63], np.uint8), 6).tolist() == [0x00, 0x00, 0xFC]
    # five codes: a second group padded with three zero codes -> 6 bytes
    assert pack_codes(np.array([1, 2, 3, 4, 5], np.uint8), 6).tolist() == [0x81, 0x30, 0x10, 0x05, 0x00, 0x00]


def test_packed_length():
    assert [packed_length(n, 4) for n in (0, 1, 2, 3, 32, 33)] == [0, 1, 1, 2, 16, 17]
    assert [packed_length(n, 6) for n in (0, 1, 4, 5, 8, 32, 33)] == [0, 3, 3, 6, 6, 24, 27]
    assert packed_length(7, 8) == 7


def test_signed_int4_nibbles():
    codes = np.array([-8, -1, 0, 7, 3], np.int8)
    # two's complement nibbles: -8 = 0x8, -1 = 0xF, 0, 7, 3 -> 0xF8, 0x70, 0x03
    packed = pack_codes(codes, 4)
    assert packed.tolist() == [0xF8, 0x70, 0x03]
    assert unpack_codes(packed, 4, 5, signed=True).tolist() == [-8, -1, 0, 7, 3]
    assert unpack_codes(packed, 4, 5).tolist() == [8, 15, 0, 7, 3]


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 31, 32, 33, 50])
def test_round_trip_random(bits, n):
    rng = np.random.default_rng(n * 10 + bits)
    codes = rng.integers(0, 1 << bits, (3, 2, n), dtype=np.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == np.uint8
    assert packed.shape == (3, 2, packed_length(n, bits))
    np.testing.assert_array_equal(unpack_codes(packed, bits, n), codes)


@pytest.mark.parametrize("bits", [4, 6])
def test_packing_is_a_bitstream(bits):
    """Independent oracle: build the LSB-first bit string of a row by hand."""
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, 13, dtype=np.uint8)
    stream = "".join(format(int(c), f"0{bits}b")[::-1] for c in codes)  # LSB first
    nbytes = packed_length(13, bits)
    stream = stream.ljust(8 * nbytes, "0")
    want = [int(stream[8 * k : 8 * k + 8][::-1], 2) for k in range(nbytes)]
    assert pack_codes(codes, bits).tolist() == want


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2", "int4"])
@pytest.mark.parametrize("n", [1, 5, 32, 33])
def test_encode_decode_packed_round_trip(name, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((4, n)) * 3).astype(np.float32)
    packed = nqdq.encode(x, name)
    bits = 4 if name in ("e2m1", "int4") else 6
    assert packed.shape == (4, packed_length(n, bits))
    unpacked = nqdq.encode(x, name, packed=False)
    np.testing.assert_array_equal(pack_codes(unpacked, bits), packed)
    got = nqdq.decode(packed, name, length=n)
    want = nqdq.decode(unpacked, name, packed=False)
    assert_same_floats(got, want, f"{name} packed decode")
    # without length, every slot is decoded: the padding decodes as code 0 (= +0.0)
    full = nqdq.decode(packed, name)
    assert full.shape[-1] == packed.shape[-1] * 8 // bits
    assert_same_floats(full[:, :n], want, "prefix")
    assert np.all(full[:, n:] == 0)


def test_e2m1_values_packed():
    # 0.5 -> code 1, 1.0 -> 2, 1.5 -> 3, 2 -> 4, 3 -> 5, 4 -> 6, 6 -> 7, -0.5 -> 9
    x = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5], np.float32)
    assert nqdq.encode(x, "e2m1").tolist() == [0x21, 0x43, 0x65, 0x97]
    np.testing.assert_array_equal(nqdq.decode(nqdq.encode(x, "e2m1"), "e2m1", length=8), x)


@pytest.mark.parametrize("scheme,n,packed_n", [("mxfp4", 50, 25), ("nvfp4", 50, 25), ("int4_group", 50, 25),
                                               ("mxfp6_e2m3", 50, 39), ("mxfp6_e3m2", 33, 27)])
def test_quantized_codes_are_packed_along_last_axis(scheme, n, packed_n):
    x = np.random.default_rng(0).standard_normal((3, n)).astype(np.float32)
    q = nqdq.quantize(x, scheme)
    assert q.codes.dtype == np.uint8
    assert q.codes.shape == (3, packed_n)
    assert q.unpacked_codes().shape == (3, n)
    bits = q.scheme.code_bits
    codes = q.unpacked_codes().view(np.uint8) & np.uint8((1 << bits) - 1)
    np.testing.assert_array_equal(pack_codes(codes, bits), q.codes)


@pytest.mark.parametrize("bits", [4, 6])
@pytest.mark.parametrize("shape", [(0, 32), (3, 0), (0,), (2, 0, 5)])
def test_pack_empty(bits, shape):
    packed = pack_codes(np.zeros(shape, np.uint8), bits)
    assert packed.shape == shape[:-1] + (packed_length(shape[-1], bits),)
    assert unpack_codes(packed, bits, shape[-1]).shape == shape


@pytest.mark.parametrize("length", [30, 9, -1])
def test_decode_bad_length_is_an_error(length):
    # 4 bytes hold 8 nibbles; asking for 30 or 9 must not quietly return 8 values, and -1
    # must not quietly drop the last one
    with pytest.raises(ValueError, match="length"):
        nqdq.decode(np.ones(4, np.uint8), "e2m1", length=length)


def test_decode_6bit_partial_group_names_codes():
    with pytest.raises(ValueError, match="codes"):
        nqdq.decode(np.ones(4, np.uint8), "e2m3")
