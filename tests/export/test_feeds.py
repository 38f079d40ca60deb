"""runtime/feeds.py: one rule per input, said to the Python API and to a request alike."""

import numpy as np
import pytest

from runtime.feeds import DECODE, DecodeInputError, Voice, broadcast_mask, check_key_mask, check_past, past_length


class RequestError(ValueError):
    """A stand-in for the server's refusal (serve.schema.RequestError, 400 by default)."""


REQUEST = Voice(RequestError, request=True)
ONE_ROW = Voice(RequestError, request=True, one_row=True)


def test_a_mask_that_does_not_broadcast_is_refused_in_each_voice():
    mask = np.ones((3, 4), bool)
    with pytest.raises(
        DecodeInputError, match=r"mask of shape \(3, 4\) does not broadcast to \(b, t, s\) = \(1, 2, 2\)$"
    ):
        broadcast_mask(mask, 1, 2, 2, DECODE)
    with pytest.raises(RequestError, match=r"= \(1, 2, 2\); send \(s,\), \(t, s\) or \(b, t, s\)") as e:
        broadcast_mask(mask, 1, 2, 2, REQUEST)
    assert "\n" not in str(e.value)
    assert broadcast_mask(np.ones(2, bool), 3, 2, 2, REQUEST).shape == (3, 2, 2)


def test_a_past_of_one_row_may_come_without_its_batch_axis_only_in_a_request():
    past = np.zeros((2, 5, 8), np.float32)
    assert check_past("past_key", past, 1, 2, 8, ONE_ROW).shape == (1, 2, 5, 8)
    with pytest.raises(DecodeInputError, match=r"past_key has shape \(2, 5, 8\); expected \(b=1, g=2, p, 8\)"):
        check_past("past_key", past, 1, 2, 8, DECODE)
    with pytest.raises(RequestError, match=r"past_key has shape \(3, 5, 8\); send \(2, p, 8\)"):
        check_past("past_key", np.zeros((3, 5, 8)), 1, 2, 8, ONE_ROW)
    with pytest.raises(RequestError, match="past_key holds 5 positions but past_value 4"):
        past_length(np.zeros((1, 2, 5, 8)), np.zeros((1, 2, 4, 8)), REQUEST)


def test_a_key_mask_is_bool_over_the_past_and_the_new_positions():
    assert check_key_mask(np.ones(7, bool), 1, 7, ONE_ROW).shape == (1, 7)
    with pytest.raises(DecodeInputError, match=r"key_mask is float32 \(1, 7\); expected bool \(b, p\+t\) = \(1, 7\)"):
        check_key_mask(np.ones((1, 7), np.float32), 1, 7, DECODE)
    with pytest.raises(RequestError, match="key_mask has dtype int8; send bool"):
        check_key_mask(np.ones(7, np.int8), 1, 7, ONE_ROW)
